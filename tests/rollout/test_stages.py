"""The harness attempt's stages under cancellation: nothing a stage started outlives its cleanup."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from polar_pl.rollout.pools import RolloutJob
from polar_pl.rollout.stages import HarnessRolloutStages
from polar_pl.sandbox.local import LocalSandbox
from polar_pl.tasks.learnable import LearnableTaskSource


class SlowStart(LocalSandbox):
    """A sandbox slow to start (a loaded machine): its workspace appears a second in."""

    def start(self) -> None:
        time.sleep(1.0)
        super().start()


def test_a_cancelled_init_leaves_no_workspace_after_cleanup(tmp_path: Path) -> None:
    """Stopping the pools cancels INIT while its thread is still starting the sandbox; cleanup then
    stopped a half-started sandbox, and the start went on to leave its workspace behind (CI, under
    load: test_crashing_evaluator_fails_the_attempt_with_its_reason)."""
    root = tmp_path / "sbx"
    root.mkdir()
    (task,) = LearnableTaskSource(n_tasks=1).tasks()
    stages = HarnessRolloutStages(None, lambda: SlowStart(base_dir=str(root)), None, None, None)  # type: ignore[arg-type]
    job = RolloutJob(rollout_id="r0", group_id="g0", task=task, member=0)

    async def cancel_then_clean() -> None:
        init = asyncio.create_task(stages.init(job))
        await asyncio.sleep(0.3)  # the thread is inside start()
        init.cancel()
        await asyncio.gather(init, return_exceptions=True)
        await stages.cleanup(job)

    asyncio.run(cancel_then_clean())
    time.sleep(1.5)  # a start still running would finish by now
    assert list(root.iterdir()) == []
