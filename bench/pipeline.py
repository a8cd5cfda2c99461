"""Stage pools vs one-stage-after-another, with simulated stage costs.

Each session costs INIT (sandbox start), RUNNING (engine work, holds one of the engine's slots)
and POSTRUN (evaluation). The baseline runs each session's stages back to back in as many
workers as the engine has slots (the engine idles while a worker is in INIT or POSTRUN); the
pools run each stage in its own bounded pool (the real `RolloutService`). Printed: wall clock and
engine busy fraction (occupied slot-seconds / (slots x wall)), whole run and steady state.

    python bench/pipeline.py                # INIT 3 s, RUNNING 6 s, POSTRUN 2 s, 64 sessions
    python bench/pipeline.py --scale 0.05   # same shape, 20x faster
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rich.console import Console
from rich.table import Table

from polar_pl.rollout.pools import Occupancy, PoolSizes, RolloutJob, RolloutResult
from polar_pl.rollout.service import RolloutService


class SimEngine:
    def __init__(self, slots: int) -> None:
        self.occ = Occupancy(slots)
        self.first: float | None = None
        self.last = 0.0

    async def work(self, seconds: float) -> None:
        self.first = self.first or time.monotonic()
        self.occ.enter()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.occ.leave()
            self.last = time.monotonic()


class SimStages:
    def __init__(self, engine: SimEngine, init_s: float, run_s: float, post_s: float) -> None:
        self.engine, self.init_s, self.run_s, self.post_s = engine, init_s, run_s, post_s

    async def init(self, job: RolloutJob) -> None:
        await asyncio.sleep(self.init_s)

    async def run(self, job: RolloutJob) -> None:
        await self.engine.work(self.run_s)

    async def postrun(self, job: RolloutJob) -> RolloutResult:
        await asyncio.sleep(self.post_s)
        return RolloutResult(job.rollout_id, job.group_id, str(job.task), "ok", 1.0)

    async def cleanup(self, job: RolloutJob) -> None:
        pass


def steady(engine: SimEngine, area_total: float, wall: float) -> float:
    span = engine.last - (engine.first or engine.last)
    return min(1.0, area_total / (engine.occ.capacity * span)) if span > 0 else 0.0


async def sequential(sessions: int, slots: int, init_s: float, run_s: float, post_s: float):
    engine = SimEngine(slots)
    stages = SimStages(engine, init_s, run_s, post_s)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(sessions):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            job = RolloutJob(f"r{i}", "g", i)
            await stages.init(job)
            await stages.run(job)
            await stages.postrun(job)

    engine.occ.reset()
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(slots)))
    wall = time.monotonic() - t0
    busy = engine.occ.fraction()
    return wall, busy, steady(engine, busy * slots * wall, wall)


def pooled(sessions: int, slots: int, init_s: float, run_s: float, post_s: float, group: int):
    engine = SimEngine(slots)
    stages = SimStages(engine, init_s, run_s, post_s)
    init_workers = slots  # enough to fill every engine slot at start-up; READY keeps it full after
    post_workers = max(1, round(slots * post_s / run_s) + 1)
    sizes = PoolSizes(init=init_workers, ready=slots, running=slots, postrun=post_workers, run_timeout_s=1e6)
    n_groups = sessions // group
    svc = RolloutService(
        stages, list(range(n_groups)), group_size=group, sizes=sizes, max_groups_in_flight=n_groups
    )
    engine.occ.reset()
    t0 = time.monotonic()
    svc.start()
    try:
        svc.next_groups(n_groups, timeout=1e6)
        wall = time.monotonic() - t0
        frac = engine.occ.fraction()
    finally:
        svc.stop()
    return wall, frac, steady(engine, frac * slots * wall, wall), (init_workers, post_workers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--slots", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--init", type=float, default=3.0)
    ap.add_argument("--run", type=float, default=6.0)
    ap.add_argument("--post", type=float, default=2.0)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every stage cost")
    a = ap.parse_args()
    i, r, p = a.init * a.scale, a.run * a.scale, a.post * a.scale
    table = Table(
        title=f"{a.sessions} sessions, INIT {a.init}s RUNNING {a.run}s POSTRUN {a.post}s (x{a.scale})"
    )
    for col in (
        "engine slots",
        "mode",
        "pools (init/run/post)",
        "wall s",
        "engine busy",
        "busy (steady)",
        "speed-up",
    ):
        table.add_column(col)
    for slots in a.slots:
        sw, sb, ss = asyncio.run(sequential(a.sessions, slots, i, r, p))
        pw, pb, ps, (iw, pw_) = pooled(a.sessions, slots, i, r, p, a.group)
        table.add_row(
            str(slots),
            "one stage after another",
            f"-/{slots}/-",
            f"{sw:.2f}",
            f"{sb:.1%}",
            f"{ss:.1%}",
            "1.00x",
        )
        table.add_row(
            str(slots),
            "stage pools",
            f"{iw}/{slots}/{pw_}",
            f"{pw:.2f}",
            f"{pb:.1%}",
            f"{ps:.1%}",
            f"{sw / pw:.2f}x",
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
