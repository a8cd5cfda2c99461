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
import resource
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
from polar_pl.gateway.handle import Gateway
from polar_pl.monitor.progress import waiting_line
from polar_pl.rollout.local import LocalRollout
from polar_pl.rollout.pools import INFRA_FAILURE, PoolSizes
from polar_pl.rollout.protocol import HarnessStages, RolloutBackend, RolloutClient, RolloutSetup
from polar_pl.rollout.service import Group, RolloutsStopped
from polar_pl.rollout.stages import RolloutOptions
from polar_pl.trajectory import MergeStats
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
        engine: Any,
        sandbox: Callable[[], Any],
        harness: Any,
        tasks: Sequence[Any],
        evaluator: Any,
        builder: Any,
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
        pause_on_push: str | None = "keep",
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
        self.max_groups_in_flight = max_groups_in_flight or 2 * groups_per_step
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
        if hasattr(engine, "on_take_out"):  # engine replicas: one that failed a push leaves every gateway
            engine.on_take_out.append(self._take_out_engine)
        self._resume: dict[str, Any] = {}
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.counters: Counter[str] = Counter()
        self._issued: deque[list[int]] = deque()
        self.batches_done = 0  # batches a training step consumed (survives resume)
        self._busy_mark = (0.0, 0.0)
        self._stage_mark: tuple[float | None, dict[str, float]] = (None, {})
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
            self.gateway = getattr(self.service, "gateway", None)
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
        model_dir = getattr(self.engine, "model_dir", None)
        if model_dir is not None:
            options.setdefault("tokenizer_dir", str(model_dir))
        return RolloutSetup(
            stages=HarnessStages(self.sandbox, self.harness, self.evaluator, self.builder, self.options),
            tasks=self.tasks,
            group_size=self.group_size,
            sizes=self.sizes,
            max_groups_in_flight=self.max_groups_in_flight,
            group_deadline_s=self.group_deadline_s,
            engine_urls=tuple(getattr(self.engine, "urls", None) or [self.engine.url]),
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
            if hasattr(self.service, "health"):  # rollout=local: its service checks while it waits
                self.service.health = self._health
            self.service.start_groups(self._resume.get("service", {}))
            self._started = True
            self._stage_mark = (time.monotonic(), {})
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
        batch = collate(
            rows, mode=self.collate_mode, token_budget=budget, pad_id=getattr(self.engine, "pad_token_id", 0)
        )
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
        if rank == 0:
            try:
                box = self.next_batch()
            except BaseException as exc:
                stopped = isinstance(exc, RolloutsStopped)  # an interrupt ends every rank's epoch alike
                why = exc if stopped else RuntimeError(f"rank 0 made no batch: {exc!r}")
                self.trainer.strategy.broadcast(why, src=0)
                raise
        box = self.trainer.strategy.broadcast(box, src=0)
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

    def _metrics(self, groups: list[Group], rows: list[TrajectoryRow], batch: TrainBatch, wait_s: float):
        every = [r for g in groups for r in g.results]
        # infrastructure failures say nothing about the policy: out of the reward statistics
        results = [r for r in every if _infra_kind(r) is None]
        rewards = [r.reward for r in results]
        infra = Counter(k for r in every if (k := _infra_kind(r)) is not None)
        m: dict[str, float] = {
            "rollout/infra_failures": float(sum(infra.values())),
            **{f"rollout/infra_failures/{kind}": float(n) for kind, n in infra.items()},
            "rollout/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
            "rollout/pass_rate": sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else 0.0,
            # this process (trainer; in thread mode also the engine and the gateway), in MiB
            "sys/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            # share of attempts the evaluator caught reaching for the evaluation itself (reward 0)
            "rollout/tampering": sum(r.info.get("eval_status") == "tampering" for r in results) / len(results)
            if results
            else 0.0,
            "rollout/sessions": len(every),
            "rollout/masked": sum(bool(r.info.get("masked")) for r in every),
            "rollout/harness_error_policy": sum(r.info.get("harness_error") == "policy" for r in every),
            "rollout/harness_error_infra": sum(r.info.get("harness_error") == "infra" for r in every),
            "rollout/rows": len(rows),
            "rollout/trainable_tokens": sum(r.num_trainable for r in rows),
            "rollout/wait_s": wait_s,
            "rollout/padding_waste": batch.padding_waste,
            # collate_mode tree: row tokens laid out once for several rows (a group's shared prompt)
            "rollout/shared_token_frac": batch.shared_tokens
            / max(batch.shared_tokens + batch.total_tokens, 1),
        }
        for stage in ("init", "running", "postrun"):  # per session, mean over the batch
            spent = [r.timings[stage] for r in results if stage in r.timings]
            if spent:
                m[f"time/session_{stage}_s"] = sum(spent) / len(spent)
        by_check: dict[str, list[float]] = {}
        for g in groups:  # per answer check: a task family that mixes kinds shows each one
            check = getattr(getattr(g.task, "answer_check", None), "kind", None)
            if check:
                by_check.setdefault(check, []).extend(r.reward for r in g.results)
        m.update({f"rollout/reward_by_check/{k}": sum(v) / len(v) for k, v in by_check.items() if v})
        if len(rewards) > 1:
            mean = m["rollout/reward_mean"]
            m["rollout/reward_std"] = (sum((x - mean) ** 2 for x in rewards) / (len(rewards) - 1)) ** 0.5
        # Counts add up over sessions; ratios are recomputed from the sums (a sum of per-session
        # ratios logged 8.0 for eight sessions whose true compression ratio was 1.0).
        stats = [MergeStats.from_metrics(r.info["merge"]) for r in results if "merge" in r.info]
        if stats:
            m.update({k: float(v) for k, v in sum(stats, MergeStats()).to_metrics("merge").items()})
        m.update({f"datamodule/{k}": float(v) for k, v in self.counters.items()})
        if self.service is not None:
            svc = self.service.metrics()  # pool/*, gateway/*, rollout/* of the backend
            m.update(svc)
            m.update(self._stage_busy(m))
            busy_s, up_s = svc.get("gateway/engine_busy_s", 0.0), svc.get("gateway/uptime_s", 0.0)
            last_busy, last_up = self._busy_mark
            if up_s > last_up:
                m["rollout/engine_busy"] = (busy_s - last_busy) / (up_s - last_up)  # since the last batch
            self._busy_mark = (busy_s, up_s)
        return m

    def _stage_busy(self, m: dict[str, float]) -> dict[str, float]:
        """rollout/busy_<stage>: each stage pool's busy fraction since the last batch."""
        now = time.monotonic()
        busy = {s: m.get(f"pool/{s}_busy_s", 0.0) for s in ("init", "running", "postrun")}
        last_t, last = self._stage_mark
        self._stage_mark = (now, busy)
        if last_t is None or now <= last_t:
            return {}
        return {f"rollout/busy_{s}": (busy[s] - last.get(s, 0.0)) / (now - last_t) for s in busy}

    def push_target(self) -> PausingEngine:
        """What the weight sync should push to: the engine, with the gateway paused meanwhile."""
        return PausingEngine(self)

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


def _infra_kind(result) -> str | None:
    """The infrastructure failure of an attempt: a sandbox one (its kind), a harness error the
    records blame on the engine or gateway ("harness"), or None (the policy's own attempt)."""
    if result.status == INFRA_FAILURE:
        return result.info.get("infra_kind", "unknown")
    if result.info.get("harness_error") == "infra":
        return "harness"
    return None


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


class PausingEngine:
    """The datamodule's engine with `update_weights_*` wrapped in a pause of every gateway (the
    rollout client's), so no engine call starts while weights change (mode "drain" also lets the
    calls in flight finish first)."""

    def __init__(self, dm: RolloutDataModule) -> None:
        object.__setattr__(self, "_dm", dm)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dm.engine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._dm.engine, name, value)

    def _paused(self, update: Callable[..., int], *args: Any) -> int:
        gateway, mode = self._dm.service, self._dm.pause_on_push
        if gateway is None:
            return update(*args)
        if mode is None:
            version = update(*args)
            gateway.set_policy_version(version)
            return version
        try:  # a drain that times out leaves the gateway paused: resume it all the same
            gateway.pause(mode)
            version = update(*args)
            gateway.set_policy_version(version)
            return version
        finally:
            gateway.resume()

    def update_weights_from_state_dict(self, state_dict: Any) -> int:
        return self._paused(self._dm.engine.update_weights_from_state_dict, state_dict)

    def update_weights_from_disk(self, path: str) -> int:
        return self._paused(self._dm.engine.update_weights_from_disk, path)

    def update_adapter(self, tensors: Any, config: Any) -> int:
        return self._paused(self._dm.engine.update_adapter, tensors, config)

    def update_adapter_from_disk(self, path: str) -> int:
        return self._paused(self._dm.engine.update_adapter_from_disk, path)


class CommitBatches(L.Callback):
    """Marks a batch's groups consumed once its step has trained (before checkpointing), and ends
    the run after `steps` batches — also a resumed run, which Lightning's epoch count would not."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        dm = trainer.datamodule
        if isinstance(dm, RolloutDataModule):
            dm.commit_batch()
            if dm.batches_done >= dm.steps:
                trainer.should_stop = True
