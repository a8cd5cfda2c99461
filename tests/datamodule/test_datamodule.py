"""RolloutDataModule end to end on CPU: embedded engine (tiny model), real gateway, local sandbox,
the mini harness, learnable tasks. Fault cases wrap the real harness / evaluator to hang or crash."""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from pathlib import Path

import pytest

from polar_pl.datamodule.datamodule import RolloutDataModule
from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.harness.mini import Mini
from polar_pl.rollout.build import RUNTIME_KEYS
from polar_pl.rollout.pools import FAILED, HARNESS_ERROR, TIMEOUT
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.sandbox.local import LocalSandbox
from polar_pl.tasks.learnable import LearnableTaskSource
from polar_pl.trajectory import PrefixBuilder


class HangAfterCall(Mini):
    """The real mini agent, then a hang: the session has a recorded call and never exits."""

    def plan(self, session, prompt, paths):
        p = super().plan(session, prompt, paths)
        cmd = " ".join(f"'{a}'" for a in p.argv)
        return dataclasses.replace(p, argv=("bash", "-c", f"{cmd}; sleep 600"))


class CrashBeforeCall(Mini):
    """A harness that dies on start-up (exit 3) before calling the model."""

    def plan(self, session, prompt, paths):
        p = super().plan(session, prompt, paths)
        return dataclasses.replace(p, argv=("bash", "-c", "echo boom >&2; exit 3"))


class AnswerWithoutCall(Mini):
    """A harness that answers at once (exit 0, no model call): its run is always evaluated."""

    def plan(self, session, prompt, paths):
        p = super().plan(session, prompt, paths)
        script = "mkdir -p .polar && echo HELLO > .polar/answer.txt"
        return dataclasses.replace(p, argv=("bash", "-c", script))


class CrashingEvaluator:
    def __init__(self, inner):
        self.inner = inner

    def prewarm(self, task):
        return self.inner.prewarm(task)

    def evaluate(self, handle, patch, answer=None):
        raise RuntimeError("evaluator exploded")

    def discard(self, handle):
        self.inner.discard(handle)


def make_dm(
    tiny_model_dir, tmp_path: Path, *, harness=None, evaluator_wrap=None, tasks=2, **kw
) -> RolloutDataModule:
    """A DataModule around a runtime of the real parts; `kw` goes to whichever of the two takes it."""
    source = LearnableTaskSource(n_tasks=tasks)
    sandbox = partial(LocalSandbox, base_dir=str(tmp_path / "sbx"))
    (tmp_path / "sbx").mkdir(exist_ok=True)
    evaluator = source.make_evaluator(sandbox)
    if evaluator_wrap is not None:
        evaluator = evaluator_wrap(evaluator)
    kw.setdefault("pools", {"init": 2, "ready": 2, "running": 2, "postrun": 2, "run_timeout_s": 60})
    kw.setdefault("groups_per_step", 2)
    kw.setdefault("max_groups_in_flight", 2 * kw["groups_per_step"])
    runtime = RolloutRuntime(
        engine=EmbeddedEngine(tiny_model_dir, served_model_name="tiny"),
        sandbox=sandbox,
        harness=harness or Mini(max_turns=2, max_tokens=16),
        tasks=source.tasks(),
        evaluator=evaluator,
        builder=PrefixBuilder(),
        group_size=kw.pop("group_size", 2),
        store_path=str(tmp_path / "traces.db"),
        progress=False,
        **{k: kw.pop(k) for k in RUNTIME_KEYS if k in kw},
    )
    return RolloutDataModule(runtime=runtime, steps=2, **kw)


def assert_nothing_left(tmp_path: Path) -> None:
    """No workspace under this test's sandbox root, and no process running in or from one."""
    root = str(tmp_path / "sbx")
    assert list(Path(root).iterdir()) == []
    left = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                where = (
                    os.readlink(proc / "cwd") + " " + (proc / "cmdline").read_bytes().decode(errors="replace")
                )
            except OSError:
                continue
            if root in where:
                left.append(f"{proc.name}: {where[:160]}")
    assert not left, f"processes left: {left}"


def results(dm: RolloutDataModule, n: int = 1):
    return [r for g in dm.runtime.client.next_groups(n, timeout=240) for r in g.results]


def test_full_batch_of_groups(tiny_model_dir, tmp_path):
    """A batch of two groups through the real stack. Its merge ratios come from the summed counts:
    they were summed over sessions (compression ratio 16 for 16 one-call sessions)."""
    dm = make_dm(tiny_model_dir, tmp_path)
    dm.setup()
    try:
        batch = dm.next_batch(timeout=240)
        m = dm.last_metrics
        groups = dm.last_groups
    finally:
        dm.teardown()
    assert len(set(batch.group_ids)) == 2 and len(set(batch.rollout_ids)) == 4
    assert m["merge/compression_ratio"] == pytest.approx(m["merge/call_tokens"] / m["merge/row_tokens"])
    assert m["merge/calls_per_row"] == pytest.approx(
        (m["merge/calls"] - m["merge/skipped_calls"]) / m["merge/rows"]
    )
    assert {g.group_id for g in groups} == set(batch.group_ids)
    assert all(r.info.session_id for g in groups for r in g.results)
    for stage in ("init", "running", "postrun"):
        assert m[f"time/session_{stage}_s"] > 0
        assert 0.0 <= m[f"rollout/busy_{stage}"] <= 1.0
    assert batch.num_rows >= 4
    assert batch.loss_mask.sum() > 0
    sampled = batch.loss_mask.bool()
    assert (batch.behavior_logprobs[sampled] < 0).all()  # real engine logprobs on sampled tokens
    assert (batch.behavior_logprobs[~sampled] == 0).all()
    assert (batch.policy_version[sampled] == 0).all()
    assert 0.0 <= m["rollout/reward_mean"] <= 1.0
    assert m["rollout/tampering"] == 0.0  # honest attempts (issue 13: caught ones count here)
    # a random tiny model may call tools on both of its 2 turns: the mini agent then exits 3 (out of
    # turns), a policy-caused harness_error that still trains (reward 0), never an infra mask
    assert m.get("datamodule/sessions_ok", 0) + m.get("datamodule/sessions_harness_error", 0) == 4
    assert m["merge/calls"] >= 4
    # ratios come from summed counts, not summed per session (which logged 8.0 for a true 1.0)
    assert m["merge/compression_ratio"] == pytest.approx(m["merge/call_tokens"] / m["merge/row_tokens"])
    assert m["merge/calls_per_row"] == pytest.approx(
        (m["merge/calls"] - m["merge/skipped_calls"]) / m["merge/rows"]
    )
    assert m["merge/sessions"] == 4
    assert "pool/running_busy" in m
    assert_nothing_left(tmp_path)


def test_hanging_harness_times_out_and_keeps_its_partial_trajectory(tiny_model_dir, tmp_path):
    pools = {"init": 2, "ready": 2, "running": 2, "postrun": 2, "run_timeout_s": 20}
    dm = make_dm(
        tiny_model_dir,
        tmp_path,
        harness=HangAfterCall(max_turns=1, max_tokens=8),
        pools=pools,
        group_size=2,
        groups_per_step=1,
    )
    dm.setup()
    try:
        dm._client()
        res = results(dm)
    finally:
        dm.teardown()
    assert [r.status for r in res] == [TIMEOUT, TIMEOUT]
    for r in res:
        assert r.reward == 0.0 and r.rows, "train_zero keeps the partial trajectory"
        assert all(row.status == TIMEOUT for row in r.rows)
        assert sum(row.num_trainable for row in r.rows) > 0
    assert_nothing_left(tmp_path)


def test_crashing_harness_is_recorded_and_the_pools_go_on(tiny_model_dir, tmp_path):
    dm = make_dm(tiny_model_dir, tmp_path, harness=CrashBeforeCall(max_tokens=8), groups_per_step=1)
    dm.setup()
    try:
        dm._client()
        res = results(dm, 2)
    finally:
        dm.teardown()
    assert len(res) == 4
    for r in res:
        # a start-up crash is infrastructure: masked, and its output is not an answer
        assert r.status == HARNESS_ERROR and r.info.harness_error == "infra" and r.info.masked
        assert r.info.exit_code == 3 and r.info.calls == 0 and "boom" in r.error
        assert r.reward == 0.0 and not r.rows and r.info.eval_status is None
    assert_nothing_left(tmp_path)


def test_crashing_evaluator_fails_the_attempt_with_its_reason(tiny_model_dir, tmp_path):
    # the harness answers without a call: a random model's out-of-turns run is a harness error and
    # never reaches the evaluator
    dm = make_dm(
        tiny_model_dir,
        tmp_path,
        harness=AnswerWithoutCall(max_tokens=8),
        evaluator_wrap=CrashingEvaluator,
        groups_per_step=1,
    )
    dm.setup()
    try:
        dm._client()
        res = results(dm, 2)
        metrics = dm.runtime.client.metrics()
    finally:
        dm.teardown()
    assert all(r.status == FAILED and r.failed_stage == "postrun" for r in res)
    assert all("evaluator exploded" in r.error for r in res)
    assert metrics["pool/failures_postrun"] == 4
    assert_nothing_left(tmp_path)


def test_stale_rows_are_dropped_and_counted(tiny_model_dir, tmp_path):
    dm = make_dm(tiny_model_dir, tmp_path, max_staleness=0, groups_per_step=1, max_groups_in_flight=1)
    dm.setup()
    try:
        dm._client()
        old = dm.runtime.client.next_groups(1, timeout=240)  # sampled at policy version 0
        engine = dm.runtime.engine
        state = {k: v.clone() for k, v in engine.backend.model.state_dict().items()}
        assert engine.update_weights_from_state_dict(state) == 1
        assert dm._fresh_rows(old) == []  # engine at 1, rows at 0, max_staleness 0
        dropped = dm.counters["rows_stale_dropped"]
        batch = dm.next_batch(timeout=240)  # stale groups skipped until fresh ones arrive
    finally:
        dm.teardown()
    assert dropped == sum(len(r.rows) for r in old[0].results) > 0
    assert (batch.policy_version[batch.loss_mask.bool()] == 1).all()


def test_teardown_after_an_exception_leaves_nothing_behind(tiny_model_dir, tmp_path):
    dm = make_dm(tiny_model_dir, tmp_path, harness=HangAfterCall(max_turns=1, max_tokens=8))
    dm.setup()
    with pytest.raises(RuntimeError, match="training blew up"):
        try:
            dm._client()
            import time

            deadline = time.monotonic() + 120
            while (
                dm.runtime.client.metrics().get("pool/running_active", 0) < 1 and time.monotonic() < deadline
            ):
                time.sleep(0.2)
            raise RuntimeError("training blew up")
        finally:
            dm.teardown()
    assert_nothing_left(tmp_path)
    assert not dm.runtime.engine.health()


def test_resume_continues_the_task_cursor(tiny_model_dir, tmp_path):
    dm = make_dm(tiny_model_dir, tmp_path, tasks=4, groups_per_step=1, group_size=1)
    dm.setup()
    try:
        trained = dm.next_batch(timeout=240).group_ids[0]
        dm.commit_batch()
        dm.next_batch(timeout=240)  # fetched ahead, never trained: must be redone after resume
        state = dm.state_dict()
    finally:
        dm.teardown()
    done = int(trained.rsplit("-g", 1)[1])  # groups complete out of order: seq 0 or 1
    expected = {"start_seq": 1, "skip_seqs": []} if done == 0 else {"start_seq": 0, "skip_seqs": [1]}
    assert state["service"] == expected
    dm2 = make_dm(tiny_model_dir, tmp_path, tasks=4, groups_per_step=1, group_size=1, max_groups_in_flight=1)
    dm2.load_state_dict(state)
    dm2.setup()
    try:
        batch = dm2.next_batch(timeout=240)
    finally:
        dm2.teardown()
    assert batch.group_ids[0].endswith(f"-g{1 - done}")  # the untrained one, never the trained one


def test_infra_failures_are_counted_by_kind_and_kept_out_of_the_reward(tiny_model_dir, tmp_path):
    """A batch's metrics count infrastructure failures per kind; they do not drag reward_mean down."""
    from types import SimpleNamespace

    from polar_pl.rollout.pools import FAILED, INFRA_FAILURE, OK, AttemptInfo, RolloutResult
    from polar_pl.rollout.service import Group

    dm = make_dm(tiny_model_dir, tmp_path)  # not set up: only the metrics are exercised
    group = Group("g0", 0, "t", (
        RolloutResult("r0", "g0", "t", OK, 1.0),
        RolloutResult("r1", "g0", "t", INFRA_FAILURE, 0.0, info=AttemptInfo(infra_kind="image")),
        RolloutResult("r2", "g0", "t", INFRA_FAILURE, 0.0, info=AttemptInfo(infra_kind="exec")),
        RolloutResult("r3", "g0", "t", FAILED, 0.0),
        RolloutResult("r4", "g0", "t", "harness_error", 0.0, info=AttemptInfo(harness_error="infra")),
    ))  # fmt: skip
    m = dm._metrics([group], [], SimpleNamespace(padding_waste=0.0, shared_tokens=0, total_tokens=0), 0.0)
    assert m["rollout/infra_failures"] == 3 and m["rollout/infra_failures/image"] == 1
    assert m["rollout/infra_failures/exec"] == 1 and m["rollout/infra_failures/harness"] == 1
    assert m["rollout/sessions"] == 5
    assert m["rollout/reward_mean"] == 0.5  # over the OK and FAILED attempts only
