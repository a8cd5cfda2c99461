"""Helpers of the rollout tests: a runtime (and a DataModule around it) on a scripted engine whose
sessions are deterministic, and the node settings of the test cluster."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from polar_pl.datamodule.datamodule import RolloutDataModule
from polar_pl.harness.mini import Mini
from polar_pl.harness.protocol import LaunchPlan
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.sandbox.local import LocalSandbox
from polar_pl.tasks.learnable import LearnableTaskSource
from polar_pl.testing.scripted import Reply
from polar_pl.trajectory import PrefixBuilder

# Faster node-death detection than Ray's 3 s x 5: dead after 8 missed checks of 1 s (3 of 0.5 s
# declared a live node dead on a loaded machine).
SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 8}
NODE = {"num_cpus": 1, "resources": {"sandbox": 2}, "object_store_memory": 80 * 1024**2}
SERVICE_TOKEN = "test-token-0"  # the bearer token of the tests' `polar-pl rollout serve`
METRICS_TOKEN = "test-metrics-0"  # its --metrics-token


def answer(chat: dict) -> Reply:
    """A deterministic reply from the prompt alone (the same session gives the same tokens)."""
    prompt = next(m["content"] for m in chat["messages"] if m["role"] == "user")
    text = prompt if isinstance(prompt, str) else str(prompt)
    return Reply(text.split()[-1].upper()[:12])


ONE_CALL = """
import json, sys, urllib.request
base, key, model, prompt = sys.argv[1:5]
body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}
req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                             headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["message"]["content"])
"""


class OneCall(Mini):
    """One chat call through the gateway from a stdlib-only script: the harness is not under test
    here, and the mini agent's openai import costs seconds per session on a loaded machine."""

    def plan(self, session, prompt, paths):
        argv = (*paths.python, "-S", "-c", ONE_CALL, session.base_url, session.token, session.model, prompt)
        return LaunchPlan(argv=argv, env={"PYTHONDONTWRITEBYTECODE": "1"})


def scripted_runtime(engine, tmp_path: Path, *, backend=None, tasks: int = 2, **kw) -> RolloutRuntime:
    """The real stack on a scripted engine: gateway, local sandboxes, a one-call harness, the
    learnable evaluator, prefix merge."""
    sbx = tmp_path / "sbx"
    sbx.mkdir(parents=True, exist_ok=True)
    source = LearnableTaskSource(n_tasks=tasks)
    sandbox = partial(LocalSandbox, base_dir=str(sbx))
    kw.setdefault("pools", {"init": 2, "ready": 2, "running": 2, "postrun": 2, "run_timeout_s": 60})
    feed = kw.pop("task_feed", None)  # a TaskQueue: empty, so falsy, until tasks are submitted
    return RolloutRuntime(
        engine=engine,
        sandbox=sandbox,
        harness=kw.pop("harness", None) or OneCall(),
        tasks=source.tasks() if feed is None else feed,
        evaluator=source.make_evaluator(sandbox),
        builder=PrefixBuilder(),
        backend=backend,
        group_size=kw.pop("group_size", 2),
        store_path=str(tmp_path / "traces.db"),
        progress=False,
        **kw,
    )


def scripted_dm(
    engine, tmp_path: Path, *, steps: int = 2, groups_per_step: int = 2, **kw
) -> RolloutDataModule:
    """A DataModule around `scripted_runtime` (in flight: 2 x groups_per_step, unless given)."""
    kw.setdefault("max_groups_in_flight", 2 * groups_per_step)
    runtime = scripted_runtime(engine, tmp_path, **kw)
    return RolloutDataModule(runtime=runtime, steps=steps, groups_per_step=groups_per_step)


class SleepStages:
    """Simulated stages (the stages are not under test): RUNNING sleeps `run_s`; one row each."""

    def __init__(self, run_s: float) -> None:
        self.run_s = run_s

    async def init(self, job) -> None:
        pass

    async def run(self, job) -> None:
        import asyncio

        await asyncio.sleep(self.run_s)

    async def postrun(self, job):
        from polar_pl.rollout.pools import RolloutResult
        from polar_pl.trajectory.rows import TrajectoryRow

        row = TrajectoryRow([1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.2], [-1, 0, 0], job.rollout_id,
                            job.rollout_id, job.group_id, reward=1.0)  # fmt: skip
        return RolloutResult(job.rollout_id, job.group_id, str(job.task), job.status, 1.0, rows=(row,))

    async def cleanup(self, job) -> None:
        pass


def sleep_stages(run_s: float):
    """A `RolloutSetup.stages` factory (gateway -> stages) for `SleepStages`."""
    return partial(_sleep_stages, run_s)


def _sleep_stages(run_s: float, gateway) -> SleepStages:
    return SleepStages(run_s)
