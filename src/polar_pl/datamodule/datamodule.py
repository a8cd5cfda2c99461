"""RolloutDataModule: owns the engine and a rollout client, and yields training batches.

`setup` starts (or connects to) the engine and connects the rollout client of the `rollout=`
backend (`local`: a gateway and the stage pools in this process; `ray`: workers on a Ray
cluster); `train_dataloader` yields one collated batch of complete GRPO groups per optimisation
step while the rollouts keep producing the next ones; `teardown` stops everything, also after an
exception or Ctrl-C. `interrupt` (from a signal handler) admits no new rollout and cancels the
running ones at once; the batches then end. `state_dict` / `load_state_dict` carry the task
cursor and the policy version across a resume.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from polar_pl.datamodule.collate import TrainBatch, collate
from polar_pl.datamodule.failfast import FailFast
from polar_pl.engine.cache_stats import PrefixCacheRate
from polar_pl.engine.pausing import PauseMode, PausingEngine
from polar_pl.engine.protocol import Engine
from polar_pl.engine.replicas import EngineReplicas
from polar_pl.gateway.handle import Gateway
from polar_pl.harness.protocol import Harness
from polar_pl.monitor.batch import BusyFractions, batch_metrics
from polar_pl.monitor.progress import waiting_line
from polar_pl.rollout.local import LocalRollout
from polar_pl.rollout.pools import PoolSizes
from polar_pl.rollout.protocol import HarnessStages, RolloutBackend, RolloutClient, RolloutSetup
from polar_pl.rollout.service import Group, RolloutsStopped
from polar_pl.rollout.stages import RolloutOptions
from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.evaluator import Evaluator
from polar_pl.tasks.task import Task
from polar_pl.trajectory.base import TrajectoryBuilder
from polar_pl.trajectory.rows import TrajectoryRow

log = logging.getLogger(__name__)


class RolloutDataModule(L.LightningDataModule):
    """Rollouts in, batches out.

    engine: an engine handle (polar_pl.engine.protocol.Engine).
    sandbox: a zero-argument factory returning a fresh Sandbox (Hydra `_partial_: true`).
    tasks: an indexable task source; evaluator: scores attempts; builder: the merge strategy.
    groups_per_step: GRPO groups per batch; group_size: attempts per task (G).
    max_staleness: a rollout whose oldest sampled token is more than this many policy versions
        behind the engine is dropped whole (all its rows, counted); None keeps everything.
    stale_unit: "rollout" drops the stale rollouts of a group; "group" drops the whole group when
        any of its rollouts is stale (its baseline is then never computed on survivors).
    dynamic_sampling: DAPO's dynamic sampling: a group whose rollouts all scored the same carries
        no GRPO signal, so more groups are drawn until `groups_per_step` groups with signal are in
        the batch, or `max_groups_drawn` groups were drawn (null: 4 x groups_per_step).
    gateway_options: passed to the gateway; by default it gets the engine's model directory as
        `tokenizer_dir`, which turns token-faithful prompts on (both engines take token prompts).
    pause_on_push: while new weights are pushed, new engine calls wait at the gateway; "drain"
        also waits for calls in flight to finish, "keep" lets them run on; None: no pause.
    rollout: where sessions run, a `RolloutBackend` (Hydra group `rollout=`); None: this process.
    engine_down_s: an engine that has not answered its health check for this long while the
        trainer waits for rollouts ends the run (`PartDown`; rollout=local) instead of failing every rollout
        for ever; so does a gateway whose server stopped.
    fail_fast_after: when the run's first this-many rollouts all failed the same way (an
        infrastructure failure: failfast.py), the run stops with that failure (`RolloutsFailing`);
        None: one group's worth (group_size); 0: never.
    wait_log_s: while the trainer waits for a batch, a line every this many seconds says what it
        waits on (rollouts running, finished, failed, the last failure); None: silent.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        sandbox: Callable[[], Sandbox],
        harness: Harness,
        tasks: Sequence[Task],
        evaluator: Evaluator,
        builder: TrajectoryBuilder,
        steps: int,
        group_size: int = 4,
        groups_per_step: int = 2,
        pools: dict[str, Any] | PoolSizes | None = None,
        max_groups_in_flight: int | None = None,
        group_deadline_s: float | None = None,
        max_staleness: int | None = 1,
        stale_unit: str = "rollout",
        dynamic_sampling: bool = False,
        max_groups_drawn: int | None = None,
        options: RolloutOptions | dict[str, Any] | None = None,
        collate_mode: str = "pack",
        token_budget: int | None = None,
        store_path: str | None = None,
        gateway_options: dict[str, Any] | None = None,
        progress: bool = True,
        pause_on_push: PauseMode | None = "keep",
        rollout: RolloutBackend | None = None,
        engine_down_s: float = 15.0,
        fail_fast_after: int | None = None,
        wait_log_s: float | None = 30.0,
    ) -> None:
        super().__init__()
        self.engine, self.sandbox, self.harness = engine, sandbox, harness
        self.tasks, self.evaluator, self.builder = tasks, evaluator, builder
        self.steps, self.group_size, self.groups_per_step = steps, group_size, groups_per_step
        self.sizes = pools if isinstance(pools, PoolSizes) else PoolSizes(**(pools or {}))
        self.max_groups_in_flight = (
            2 * groups_per_step if max_groups_in_flight is None else max_groups_in_flight
        )
        self.group_deadline_s, self.max_staleness = group_deadline_s, max_staleness
        if stale_unit not in ("rollout", "group"):
            raise ValueError(f"datamodule.stale_unit={stale_unit!r}: allowed values are rollout, group")
        self.stale_unit, self.dynamic_sampling = stale_unit, dynamic_sampling
        self.max_groups_drawn = max_groups_drawn or 4 * groups_per_step
        self.options = options if isinstance(options, RolloutOptions) else RolloutOptions(**(options or {}))
        self.collate_mode, self.token_budget = collate_mode, token_budget
        self.store_path, self.gateway_options = store_path, dict(gateway_options or {})
        self.progress = progress
        if pause_on_push not in (None, "drain", "keep"):
            raise ValueError(
                f"datamodule.pause_on_push={pause_on_push!r}: allowed values are drain, keep, null"
            )
        self.pause_on_push = pause_on_push
        self.rollout = rollout or LocalRollout()
        self.gateway: Gateway | None = None  # rollout=local: the in-process gateway
        self.service: RolloutClient | None = None
        self._started = False
        if isinstance(engine, EngineReplicas):  # a replica that failed a push leaves every gateway
            engine.on_take_out.append(self._take_out_engine)
        self._resume: dict[str, Any] = {}
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.counters: Counter[str] = Counter()
        self._issued: deque[list[int]] = deque()
        self.batches_done = 0  # batches a training step consumed (survives resume)
        self._busy = BusyFractions()
        self._prefix_cache = PrefixCacheRate()
        self._batch_metrics: deque[dict[str, float]] = deque()
        self._batch_groups: deque[list[Group]] = deque()
        self.wait_total_s = 0.0  # trainer time spent blocked on rollouts, over the run
        self.interrupted = False
        self._service_lock = threading.Lock()
        self.engine_down_s = engine_down_s
        self._checked_at = 0.0
        self._engine_down_since: float | None = None
        self.fail_fast = FailFast(group_size if fail_fast_after is None else fail_fast_after)
        if wait_log_s is not None and wait_log_s <= 0:
            raise ValueError(f"datamodule.wait_log_s={wait_log_s}: must be > 0 (null: no waiting lines)")
        self.wait_log_s = wait_log_s

    # ---- lifecycle ------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.service is not None or self._rank()[0] != 0:
            return  # a multi-process trainer: rank 0 owns the engine and the rollouts
        try:
            t0 = time.monotonic()
            self.engine.start()
            log.info("engine ready: %s at %s (%.1f s)", type(self.engine).__name__, self.engine.url,
                     time.monotonic() - t0)  # fmt: skip
            setup = self.rollout_setup()
            self.service = self.rollout.connect(setup)
            self.gateway = self.service.gateway
            if self.gateway is not None:
                log.info("gateway ready: %s, traces in %s", self.gateway.url, setup.store_path)
            else:
                log.info(
                    "rollouts ready: %s, traces next to %s", type(self.service).__name__, setup.store_path
                )
        except BaseException:
            self.teardown()
            raise

    def _rank(self) -> tuple[int, int]:
        """(global rank, world size) of the trainer this datamodule feeds; (0, 1) without one."""
        t = self.trainer
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def _take_out_engine(self, url: str) -> None:
        if self.service is not None:
            self.service.take_out_engine(url)

    def rollout_setup(self) -> RolloutSetup:
        """What this run's rollouts need (the held-out evaluation runs its attempts with the same)."""
        options = dict(self.gateway_options)
        if self.engine.model_dir is not None:
            options.setdefault("tokenizer_dir", str(self.engine.model_dir))
        return RolloutSetup(
            stages=HarnessStages(self.sandbox, self.harness, self.evaluator, self.builder, self.options),
            tasks=self.tasks,
            group_size=self.group_size,
            sizes=self.sizes,
            max_groups_in_flight=self.max_groups_in_flight,
            group_deadline_s=self.group_deadline_s,
            engine_urls=tuple(self.engine.urls),
            store_path=self.store_path or self._tmp_store(),
            gateway_options=options,
        )

    def rollouts(self) -> RolloutClient:
        """The rollout client with groups started (the HTTP rollout service drives it directly)."""
        return self._start_service()

    def _start_service(self) -> RolloutClient:
        """Groups start on first use, after Lightning restored `load_state_dict` on a resume."""
        if self.interrupted:
            raise RolloutsStopped("the run is shutting down: no new rollouts")
        assert self.service is not None, "setup() first"
        if not self._started:
            self.service.health = self._health
            self.service.start_groups(self._resume.get("service", {}))
            self._started = True
            self._busy.since_last(self.service.metrics())  # the first batch's window starts here
        return self.service

    def teardown(self, stage: str | None = None) -> None:
        """Stop rollouts (every sandbox and session cleaned, gateways flushed), then the engine.
        Idempotent."""
        for stop in (self._stop_service, self.engine.stop):
            try:
                stop()
            except Exception:
                log.exception("teardown step %s failed", getattr(stop, "__name__", stop))
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _health(self) -> str | None:
        """Why no rollout can succeed any more (engine or gateway down), or None; checked at most
        every 2 s while the trainer waits for rollouts."""
        now = time.monotonic()
        if now - self._checked_at < 2.0:
            return None
        self._checked_at = now
        if self.gateway is not None and not self.gateway.alive:
            return "the gateway's server stopped"
        if self.engine.health():
            self._engine_down_since = None
            return None
        self._engine_down_since = self._engine_down_since or now
        down = now - self._engine_down_since
        if down < self.engine_down_s:
            return None
        return f"the engine at {self.engine.url} has not answered its health check for {down:.0f} s"

    def interrupt(self, harness_grace_s: float = 10.0) -> None:
        """Admit no new rollout from now on and cancel the running ones (their harnesses are
        killed with their sandboxes), off the calling thread: safe from a signal handler.
        harness_grace_s: how long the cancelled jobs' cleanups may take."""
        self.interrupted = True
        service = self.service
        if service is not None:
            service.stop_feeding()
        threading.Thread(
            target=self._stop_service, args=(harness_grace_s,), name="rollouts-interrupt", daemon=True
        ).start()

    def stop_rollouts(self, timeout: float = 60.0) -> None:
        """Stop the training rollouts (sandboxes and sessions cleaned, the gateway flushed); the
        engine keeps serving. Keeps the resume cursor, as a checkpoint after this needs it."""
        self._stop_service(timeout)

    def _stop_service(self, timeout: float = 60.0) -> None:
        with self._service_lock:
            if self.service is None:
                return
            try:
                if self._started:  # a checkpoint after this still knows the cursor
                    self._resume["service"] = self.service.state_dict()
            except Exception:  # a lost controller: the last checkpoint's cursor stands
                log.exception("rollouts: no resume cursor at stop")
            try:
                self.service.close(timeout)
            finally:
                self.service, self.gateway, self._started = None, None, False

    def _tmp_store(self) -> str:
        self._tmp = tempfile.TemporaryDirectory(prefix="polar-traces-")
        return str(Path(self._tmp.name) / "traces.db")

    # ---- data -----------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Batches(self), batch_size=None, num_workers=0)

    def next_batch(self, timeout: float | None = None) -> TrainBatch:
        """Take groups_per_step released groups, drop stale rollouts, collate. Groups left without
        rows (all stale or failed) are replaced by the next ones instead of yielding an empty
        step; with dynamic sampling, so are groups without reward variance (up to
        max_groups_drawn). The groups count as consumed (for resume) only when `commit_batch`
        says a step trained on them."""
        service = self._start_service()
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

    def live_metrics(self) -> dict[str, float]:
        """Stage gauges for the live display (empty until the pools start)."""
        return self.service.metrics() if self._started and self.service is not None else {}

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
        current = self.engine.policy_version()
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
        if self.service is not None:
            client = self.service.metrics()  # pool/*, gateway/*, rollout/* of the backend
            m.update(client)
            m.update(self._busy.since_last(client))
        m.update(self._prefix_cache.since_last(self.engine.urls))
        return m

    def push_target(self) -> PausingEngine:
        """What the weight sync should push to: the engine, with the gateways paused meanwhile."""
        return PausingEngine(self.engine, lambda: self.service, self.pause_on_push)

    def commit_batch(self) -> None:
        """Called after a training step used the oldest issued batch (see `CommitBatches`)."""
        if self._batch_metrics:
            self._batch_metrics.popleft()
            self._batch_groups.popleft()
        if self._issued:
            seqs = self._issued.popleft()
            with self._service_lock:  # not while an interrupt is closing the rollouts
                if seqs and self._started and self.service is not None:
                    self.service.mark_consumed(seqs)
            self.batches_done += 1

    # ---- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # rank 0 owns the engine (also after an interrupt closed the rollouts); other ranks carry rank 0's
        rank0 = self._rank()[0] == 0
        version = self.engine.policy_version() if rank0 else self._resume.get("policy_version", 0)
        state: dict[str, Any] = {
            "policy_version": int(version),
            "batches_done": self.batches_done,
        }
        # (the shutdown checkpoint comes while an interrupt closes the rollouts: after it, the cursor
        # it kept; a client half-closed has none to give)
        with self._service_lock:
            if self._started and self.service is not None:
                state["service"] = self.service.state_dict()
            elif "service" in self._resume:
                state["service"] = self._resume["service"]
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
