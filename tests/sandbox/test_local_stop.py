"""LocalSandbox.stop() racing an exec that is about to spawn (found by the datamodule teardown test:
a harness launched while the pools were being stopped outlived its deleted workspace)."""

from __future__ import annotations

import threading

import pytest

from polar_pl.sandbox.local import LocalSandbox


def test_exec_after_stop_is_refused_not_spawned(tmp_path):
    sb = LocalSandbox(base_dir=str(tmp_path))
    sb.start()
    sb.stop()
    with pytest.raises(RuntimeError, match="stopped|not started"):
        sb.exec(["sleep", "600"])
    assert list(tmp_path.iterdir()) == []


def test_stop_kills_a_command_spawned_concurrently(tmp_path):
    sb = LocalSandbox(base_dir=str(tmp_path))
    sb.start()
    results: list[object] = []

    def run() -> None:
        try:
            results.append(sb.exec(["sleep", "600"], timeout=120))
        except RuntimeError as exc:  # stop() won the race: nothing was spawned
            results.append(exc)

    t = threading.Thread(target=run)
    t.start()
    sb.stop()
    t.join(30)
    assert not t.is_alive(), "the command outlived stop()"
    assert results
