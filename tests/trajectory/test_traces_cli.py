"""`polar-pl traces export`: a real trace store in, rows and stats out (JSONL and parquet)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from traj_sessions import simulate
from traj_tokens import GEN, NL, E, rec, system, user

from polar_pl.cli import main
from polar_pl.gateway.store.records import TraceRecord
from polar_pl.gateway.store.traces import TraceStore
from polar_pl.trajectory import PerRequestBuilder, PrefixBuilder
from polar_pl.trajectory.traces_cli import plain_renders, read_rows

P1 = system(100) + user(101) + GEN
P2 = P1 + [200, E, NL] + user(102) + GEN


def _records() -> list[TraceRecord]:
    """Logprobs are float32 values, as engines compute them and the store keeps them."""
    return [replace(r, response_logprobs=np.float32(r.response_logprobs).tolist()) for r in _plain_records()]


def _plain_records() -> list[TraceRecord]:
    a = [rec(0, P1, [200, E], session="a"), rec(1, P2, [201, E], session="a")]
    b = [
        TraceRecord.from_dict(r.to_dict() | {"session_id": "b"})
        for r in simulate(
            [("new", [100], [101], [102]), ("side", [1], [104]), ("extend", 0, [103], [104], True)]
        )
    ]
    return a + b


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "traces.db"
    s = TraceStore(path, synchronous="NORMAL")
    for r in _records():
        s.append(r).result()
    s.close()
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("merge", ["prefix", "per_request"])
def test_export_writes_the_builder_rows(store, tmp_path, capsys, suffix: str, merge: str) -> None:
    out = tmp_path / f"rows{suffix}"
    stats = tmp_path / "stats.json"
    rewards = tmp_path / "rewards.json"
    rewards.write_text(json.dumps({"a": 1.0, "b": 0.25}))
    argv = ["traces", "export", "--store", str(store), "--merge", merge, "--out", str(out)]
    assert main([*argv, "--rewards", str(rewards), "--stats-json", str(stats)]) == 0
    builder = PrefixBuilder() if merge == "prefix" else PerRequestBuilder()
    recs = _records()
    expected = builder.build(recs[:2], reward=1.0).rows + builder.build(recs[2:], reward=0.25).rows
    assert read_rows(out) == expected
    printed = capsys.readouterr().out
    assert (
        f"merge={merge}" in printed
        and "all (2 sessions)" in printed
        and f"wrote {len(expected)} rows" in printed
    )
    batch = json.loads(stats.read_text())["batch"]
    assert batch["calls"] == 5 and batch["rows"] == len(expected)
    if merge == "prefix":
        assert batch["breaks"]["side_call"] == 1 and batch["compression_ratio"] > 1.0


def test_console_script_runs(store, tmp_path) -> None:
    out = tmp_path / "rows.jsonl"
    cmd = [sys.executable, "-m", "polar_pl.cli", "traces", "export", "--store", str(store), "--out", str(out)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "merge=prefix" in proc.stdout and len(read_rows(out)) == 3  # a: 1 chain; b: chain + side


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "rows.csv"], "extension must be one of"),
        (["--store", "missing.db"], "no such file"),
    ],
)
def test_bad_input_is_a_clear_error(store, tmp_path, capsys, monkeypatch, extra, message) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["traces", "export", "--store", str(store), "--out", "rows.jsonl"]
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        argv[argv.index(flag) + 1] = value
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_compare_rendered_shows_the_drift_token_faithful_prompts_removed(tmp_path, capsys) -> None:
    spliced = P2  # the gateway spliced the sampled [200, E] back in ...
    rendered = P1 + [250, E, NL] + user(102) + GEN  # ... where a plain render re-tokenized it
    records = [rec(0, P1, [200, E]), rec(1, spliced, [201, E], rendered=rendered)]
    assert PrefixBuilder().build(records).stats.breaks == {}
    assert PrefixBuilder().build(plain_renders(records)).stats.breaks == {"drift": 1}
    path = tmp_path / "traces.db"
    s = TraceStore(path, synchronous="NORMAL")
    for r in records:
        s.append(r).result()
    s.close()
    argv = [
        "traces",
        "export",
        "--store",
        str(path),
        "--out",
        str(tmp_path / "r.jsonl"),
        "--compare-rendered",
    ]
    assert main(argv) == 0
    assert "plain re-renders (token-faithful off)" in capsys.readouterr().out


def _big_store(path, sessions: int) -> None:
    """`sessions` sessions of 4 calls of 300-token prompts, written in the store's own layout."""
    import sqlite3

    from polar_pl.gateway.store import layout

    conn = sqlite3.connect(path, isolation_level=None)
    layout.migrate(conn)
    # call i's prompt extends call i-1's prompt + response: one row per session
    prompts = [[*range(10, 300), *(t for j in range(i) for t in (200 + j, E, 7))] for i in range(4)]
    recs = (rec(i, prompts[i], [200 + i, E], session=f"s{s:05d}") for s in range(sessions) for i in range(4))
    conn.executemany(layout.INSERT, [(r.session_id, r.call_index, 0.0, *layout.encode(r)) for r in recs])
    conn.close()


def test_export_memory_does_not_grow_with_the_store(tmp_path) -> None:
    """The export read every record of the store into memory, then built and held every row
    before writing any: its memory grew with the store (a 1 M-call store did not fit)."""
    import tracemalloc

    def export(n: int) -> None:
        argv = [
            "traces",
            "export",
            "--store",
            str(tmp_path / f"{n}.db"),
            "--out",
            str(tmp_path / f"{n}.jsonl"),
        ]
        assert main([*argv, "--max-session-rows", "0"]) == 0

    peaks = []
    for n in (20, 80):
        _big_store(tmp_path / f"{n}.db", n)
    export(20)  # imports (Hydra, rich) before tracing: they are not the export's memory, and slow under it
    for n in (20, 80):
        tracemalloc.start()
        export(n)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert len(read_rows(tmp_path / f"{n}.jsonl")) == n
    assert peaks[1] < 1.5 * peaks[0], peaks  # 4x the store: the old export peaked ~4x higher
