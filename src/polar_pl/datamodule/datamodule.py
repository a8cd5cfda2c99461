"""RolloutDataModule: the Lightning glue between a `RolloutRuntime` and the trainer.

It owns the runtime's lifetime in training: `setup` starts it (the engine, and the rollout client
of the `rollout=` backend), `teardown` stops it, also after an exception or Ctrl-C. Between them,
`train_dataloader` yields one collated batch of complete GRPO groups per optimisation step while
the rollouts keep producing the next ones (staleness, dynamic sampling, the multi-rank
broadcast); `state_dict` / `load_state_dict` carry the task cursor and the policy version across a
resume. The runtime's parts are built elsewhere (`rollout.build.build_runtime`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from polar_pl.datamodule.collate import TrainBatch, collate
from polar_pl.datamodule.failfast import FailFast
from polar_pl.engine.cache_stats import PrefixCacheRate
from polar_pl.monitor.batch import BusyFractions, batch_metrics
from polar_pl.monitor.progress import waiting_line
from polar_pl.rollout.protocol import RolloutClient
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.rollout.service import Group, RolloutsStopped
from polar_pl.trajectory.rows import TrajectoryRow

log = logging.getLogger(__name__)


class RolloutDataModule(L.LightningDataModule):
    """Rollouts in, batches out (implements `rollout.runtime.RolloutFeed`).

    runtime: the run's `RolloutRuntime` (engine, rollout client, push target, health, interrupt).
    steps: batches over the whole run; groups_per_step: GRPO groups per batch.
    max_staleness: a rollout whose oldest sampled token is more than this many policy versions
        behind the engine is dropped whole (all its rows, counted); None keeps everything.
    stale_unit: "rollout" drops the stale rollouts of a group; "group" drops the whole group when
        any of its rollouts is stale (its baseline is then never computed on survivors).
    dynamic_sampling: DAPO's dynamic sampling: a group whose rollouts all scored the same carries
        no GRPO signal, so more groups are drawn until `groups_per_step` groups with signal are in
        the batch, or `max_groups_drawn` groups were drawn (null: 4 x groups_per_step).
    fail_fast_after: when the run's first this-many rollouts all failed the same way (an
        infrastructure failure: failfast.py), the run stops with that failure (`RolloutsFailing`);
        None: one group's worth (the runtime's group_size); 0: never.
    wait_log_s: while the trainer waits for a batch, a line every this many seconds says what it
        waits on (rollouts running, finished, failed, the last failure); None: silent.
    """

    def __init__(
        self,
        *,
        runtime: RolloutRuntime,
        steps: int,
        groups_per_step: int = 2,
        max_staleness: int | None = 1,
        stale_unit: str = "rollout",
        dynamic_sampling: bool = False,
        max_groups_drawn: int | None = None,
        collate_mode: str = "pack",
        token_budget: int | None = None,
        fail_fast_after: int | None = None,
        wait_log_s: float | None = 30.0,
    ) -> None:
        super().__init__()
        self.runtime = runtime
        self.steps, self.groups_per_step = steps, groups_per_step
        self.max_staleness = max_staleness
        if stale_unit not in ("rollout", "group"):
            raise ValueError(f"datamodule.stale_unit={stale_unit!r}: allowed values are rollout, group")
        self.stale_unit, self.dynamic_sampling = stale_unit, dynamic_sampling
        self.max_groups_drawn = max_groups_drawn or 4 * groups_per_step
        self.collate_mode, self.token_budget = collate_mode, token_budget
        self._resume: dict[str, Any] = {}
        self.counters: Counter[str] = Counter()
        self._issued: deque[list[int]] = deque()
        self.batches_done = 0  # batches a training step consumed (survives resume)
        self._busy = BusyFractions()
        self._prefix_cache = PrefixCacheRate()
        self._batch_metrics: deque[dict[str, float]] = deque()
        self._batch_groups: deque[list[Group]] = deque()
        self.wait_total_s = 0.0  # trainer time spent blocked on rollouts, over the run
        self.fail_fast = FailFast(runtime.group_size if fail_fast_after is None else fail_fast_after)
        if wait_log_s is not None and wait_log_s <= 0:
            raise ValueError(f"datamodule.wait_log_s={wait_log_s}: must be > 0 (null: no waiting lines)")
        self.wait_log_s = wait_log_s

    # ---- lifecycle ------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self._rank()[0] == 0:  # a multi-process trainer: rank 0 owns the engine and the rollouts
            self.runtime.start()

    def teardown(self, stage: str | None = None) -> None:
        """Stop the rollouts (every sandbox and session cleaned, gateways flushed), then the engine.
        Idempotent."""
        self.runtime.stop()

    def _rank(self) -> tuple[int, int]:
        """(global rank, world size) of the trainer this datamodule feeds; (0, 1) without one."""
        t = self.trainer
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def _client(self) -> RolloutClient:
        """Groups start on first use, after Lightning restored `load_state_dict` on a resume."""
        first = not self.runtime.started
        client = self.runtime.rollouts(self._resume.get("service", {}))
        if first:
            self._busy.since_last(client.metrics())  # the first batch's window starts here
        return client

    # ---- data -----------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Batches(self), batch_size=None, num_workers=0)

    def next_batch(self, timeout: float | None = None) -> TrainBatch:
        """Take groups_per_step released groups, drop stale rollouts, collate. Groups left without
        rows (all stale or failed) are replaced by the next ones instead of yielding an empty
        step; with dynamic sampling, so are groups without reward variance (up to
        max_groups_drawn). The groups count as consumed (for resume) only when `commit_batch`
        says a step trained on them."""
        service = self._client()
        t0 = time.monotonic()
        seqs: list[int] = []
        groups: list[Group] = []
        rows: list[TrajectoryRow] = []
        flat: list[TrajectoryRow] = []  # rows of groups without signal, trained only if nothing else came
        kept = 0
        while kept < self.groups_per_step:
            taken = self._next_groups(service, self.groups_per_step - kept, timeout)
            self.fail_fast.see(r for g in taken for r in g.results)
            seqs += [g.seq for g in taken]
            groups += taken
            for g in taken:
                g_rows = self._fresh_rows([g])
                if self.dynamic_sampling and g_rows and not _has_signal(g_rows):
                    self.counters["groups_without_signal"] += 1
                    flat += g_rows
                elif g_rows:
                    rows += g_rows
                    kept += 1
            if (
                (rows and not self.dynamic_sampling)
                or len(groups) >= self.max_groups_drawn
                and (rows or flat)
            ):
                break
            if not rows and not flat:
                self.counters["batches_without_rows"] += 1
        rows = rows or flat
        wait_s = time.monotonic() - t0
        self.wait_total_s += wait_s
        longest = (
            None if self.collate_mode == "tree" else max(len(r.input_ids) for r in rows)
        )  # tree: the longest tree
        budget = self.token_budget or longest
        batch = collate(rows, mode=self.collate_mode, token_budget=budget)
        self._issued.append(seqs)
        metrics = self._metrics(groups, rows, batch, wait_s)
        metrics["rollout/groups_drawn"] = float(len(groups))
        self._batch_metrics.append(metrics)
        self._batch_groups.append(groups)
        return batch

    def _next_groups(self, service: RolloutClient, n: int, timeout: float | None) -> list[Group]:
        """`service.next_groups(n)`, with a line every `wait_log_s` saying what it waits on: a run
        whose rollouts crawl or all fail is never silent, in a log as in a terminal."""
        t0 = time.monotonic()
        while True:
            left = None if timeout is None else timeout - (time.monotonic() - t0)
            if self.wait_log_s is None or (left is not None and left <= self.wait_log_s):
                return service.next_groups(n, timeout=left, consume=False)
            try:
                return service.next_groups(n, timeout=self.wait_log_s, consume=False)
            except TimeoutError:
                pass
            self._log_waiting(service, time.monotonic() - t0)

    def _log_waiting(self, service: RolloutClient, waited: float) -> None:
        batch = f"batch {self.batches_done + len(self._issued) + 1}/{self.steps}"
        try:
            metrics, last_failure = service.metrics(), service.last_failure()
        except Exception:  # a status line must not end the run it reports on
            log.debug("rollout status unavailable", exc_info=True)
            metrics, last_failure = {}, None
        log.info("%s", waiting_line(waited, batch, metrics, last_failure))

    def shared_batch(self) -> TrainBatch:
        """`next_batch` on rank 0; under a multi-process trainer every rank gets rank 0's batch
        (each trains on its share of it, see GRPOModule). An error on rank 0 reaches every rank."""
        rank, world = self._rank()
        if world == 1:
            return self.next_batch()
        box: Any = None
        trainer = self.trainer
        assert trainer is not None  # a world of several ranks comes from a trainer
        if rank == 0:
            try:
                box = self.next_batch()
            except BaseException as exc:
                stopped = isinstance(exc, RolloutsStopped)  # an interrupt ends every rank's epoch alike
                why = exc if stopped else RuntimeError(f"rank 0 made no batch: {exc!r}")
                trainer.strategy.broadcast(why, src=0)
                raise
        box = trainer.strategy.broadcast(box, src=0)
        if isinstance(box, BaseException):
            raise box
        if rank != 0:
            self._issued.append([])  # the step count (batches_done) advances on every rank
        return box

    @property
    def last_metrics(self) -> dict[str, float]:
        """Rollout metrics of the batch being trained now: the oldest one not yet committed
        (Lightning fetches the next batch before training this one)."""
        return self._batch_metrics[0] if self._batch_metrics else {}

    @property
    def last_groups(self) -> list[Group]:
        """The groups of the batch being trained now (the oldest not yet committed)."""
        return self._batch_groups[0] if self._batch_groups else []

    def _fresh_rows(self, groups: list[Group]) -> list[TrajectoryRow]:
        """The rows of `groups` without the stale rollouts (or groups, by `stale_unit`)."""
        current = self.runtime.policy_version()
        rows: list[TrajectoryRow] = []
        for g in groups:
            self.counters["groups"] += 1
            self.counters["groups_incomplete"] += int(not g.complete)
            stale = [self._stale(r.rows, current) for r in g.results]
            if self.stale_unit == "group" and any(stale):
                self.counters["groups_stale_dropped"] += 1
                stale = [bool(r.rows) for r in g.results]
            for r, is_stale in zip(g.results, stale, strict=True):
                self.counters[f"sessions_{r.status}"] += 1
                if is_stale:
                    self.counters["rollouts_stale_dropped"] += 1
                    self.counters["rows_stale_dropped"] += len(r.rows)
                else:
                    rows.extend(r.rows)
        return rows

    def _stale(self, rows: Sequence[TrajectoryRow], current: int) -> bool:
        """A rollout is stale when its oldest sampled token is past max_staleness."""
        if self.max_staleness is None:
            return False
        versions = [v for row in rows for v, m in zip(row.policy_version, row.loss_mask, strict=True) if m]
        return bool(versions) and current - min(versions) > self.max_staleness

    def _metrics(
        self, groups: list[Group], rows: list[TrajectoryRow], batch: TrainBatch, wait_s: float
    ) -> dict[str, float]:
        m = batch_metrics(groups, rows, batch, wait_s, self.counters)
        client = self.runtime.client
        if client is not None:
            gauges = client.metrics()  # pool/*, gateway/*, rollout/* of the backend
            m.update(gauges)
            m.update(self._busy.since_last(gauges))
        m.update(self._prefix_cache.since_last(self.runtime.engine.urls))
        return m

    def commit_batch(self) -> None:
        """Called after a training step used the oldest issued batch (see `CommitBatches`)."""
        if self._batch_metrics:
            self._batch_metrics.popleft()
            self._batch_groups.popleft()
        if self._issued:
            seqs = self._issued.popleft()
            self.runtime.mark_consumed(seqs)
            self.batches_done += 1

    # ---- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # rank 0 owns the engine (also after an interrupt closed the rollouts); other ranks carry rank 0's
        rank0 = self._rank()[0] == 0
        version = self.runtime.policy_version() if rank0 else self._resume.get("policy_version", 0)
        state: dict[str, Any] = {
            "policy_version": int(version),
            "batches_done": self.batches_done,
        }
        # (the shutdown checkpoint comes while an interrupt closes the rollouts: after it, the cursor
        # the runtime kept; a client half-closed has none to give)
        cursor = self.runtime.cursor()
        if cursor is None:
            cursor = self._resume.get("service")
        if cursor is not None:
            state["service"] = cursor
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume = dict(state_dict)
        self.batches_done = int(state_dict.get("batches_done", 0))


def _has_signal(rows: Sequence[TrajectoryRow]) -> bool:
    """Whether the task rollouts of a group's rows scored differently (side rows do not count)."""
    rewards = {r.rollout_id: r.reward for r in rows if r.meta.get("call_kind") != "side"}
    return len(rewards) > 1 and max(rewards.values()) - min(rewards.values()) > 1e-8


class _Batches(IterableDataset):
    """One batch per training step until `steps` batches were trained over the whole run (a resumed
    run yields only the rest). The run length is counted in batches, not optimiser steps: GRPO skips
    a batch whose groups carry no signal, and a converged run must still end."""

    def __init__(self, dm: RolloutDataModule) -> None:
        self.dm = dm

    def __iter__(self) -> Iterator[TrainBatch]:
        for _ in range(max(0, self.dm.steps - self.dm.batches_done)):
            try:
                batch = self.dm.shared_batch()
            except RolloutsStopped:  # interrupted: the epoch (and, with should_stop, the run) ends
                return
            yield batch


class CommitBatches(L.Callback):
    """Marks a batch's groups consumed once its step has trained (before checkpointing), and ends
    the run after `steps` batches — also a resumed run, which Lightning's epoch count would not."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        dm = trainer.datamodule
        if isinstance(dm, RolloutDataModule):
            dm.commit_batch()
            if dm.batches_done >= dm.steps:
                trainer.should_stop = True
