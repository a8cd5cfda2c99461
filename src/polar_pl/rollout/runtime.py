"""RolloutRuntime: a run's rollouts without Lightning: the engine, the rollout client of the
`rollout=` backend, the target weight pushes go to, the health check and the interrupt.

    runtime.start()                        # engine up, gateways / workers connected
    client = runtime.rollouts(cursor)      # groups start (from a resume cursor) on first use
    ...client.next_groups(...)...; runtime.push_target().update_weights_from_disk(path)
    runtime.stop()                         # rollouts closed (sandboxes, sessions), then the engine

Training drives it through `RolloutDataModule` (its `setup` starts the runtime, its `teardown`
stops it); `polar-pl rollout serve`, SFT generation and the held-out evaluation drive it directly.
Built from a config by `rollout.build.build_runtime`.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

from polar_pl.engine.pausing import PauseMode, PausingEngine
from polar_pl.engine.protocol import Engine
from polar_pl.engine.replicas import EngineReplicas
from polar_pl.gateway.handle import Gateway
from polar_pl.harness.protocol import Harness
from polar_pl.rollout.local import LocalRollout
from polar_pl.rollout.pools import PoolSizes
from polar_pl.rollout.protocol import HarnessStages, RolloutBackend, RolloutClient, RolloutSetup
from polar_pl.rollout.service import Group, RolloutsStopped
from polar_pl.rollout.stages import RolloutOptions
from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.evaluator import Evaluator
from polar_pl.tasks.task import Task
from polar_pl.trajectory.base import TrajectoryBuilder

log = logging.getLogger(__name__)


class RolloutRuntime:
    """The parts a run's sessions need, and their lifetime.

    engine: an engine handle; sandbox: a zero-argument factory returning a fresh Sandbox; harness,
        tasks (an indexable task source), evaluator, builder (the merge strategy): as the stages use them.
    backend: where sessions run (Hydra group `rollout=`); None: this process (`LocalRollout`).
    group_size: attempts per task (G); pools: the stage pools' sizes; max_groups_in_flight: groups
        started ahead of the consumer; group_deadline_s: release a group with its finished members
        after this long; options: the stages' `RolloutOptions`.
    store_path: the gateway's trace store (None: a temporary one, removed at `stop`).
    gateway_options: passed to the gateway; the engine's model directory is added as `tokenizer_dir`
        (token-faithful prompts: both engines take token prompts).
    pause_on_push: while new weights are pushed, new engine calls wait at the gateway; "drain" also
        waits for calls in flight to finish, "keep" lets them run on; None: no pause.
    engine_down_s: an engine that has not answered its health check for this long while a consumer
        waits for groups ends the wait (`PartDown`, rollout=local); so does a gateway whose server stopped.
    progress: a live table of stage counts while the rollouts run (the drivers draw it).
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
        backend: RolloutBackend | None = None,
        group_size: int = 4,
        pools: dict[str, Any] | PoolSizes | None = None,
        max_groups_in_flight: int = 2,
        group_deadline_s: float | None = None,
        options: RolloutOptions | dict[str, Any] | None = None,
        store_path: str | None = None,
        gateway_options: dict[str, Any] | None = None,
        pause_on_push: PauseMode | None = "keep",
        engine_down_s: float = 15.0,
        progress: bool = True,
    ) -> None:
        self.engine, self.sandbox, self.harness = engine, sandbox, harness
        self.tasks, self.evaluator, self.builder = tasks, evaluator, builder
        self.backend: RolloutBackend = backend or LocalRollout()
        self.group_size = group_size
        self.sizes = pools if isinstance(pools, PoolSizes) else PoolSizes(**(pools or {}))
        self.max_groups_in_flight, self.group_deadline_s = max_groups_in_flight, group_deadline_s
        self.options = options if isinstance(options, RolloutOptions) else RolloutOptions(**(options or {}))
        self.store_path, self.gateway_options = store_path, dict(gateway_options or {})
        if pause_on_push not in (None, "drain", "keep"):
            raise ValueError(
                f"datamodule.pause_on_push={pause_on_push!r}: allowed values are drain, keep, null"
            )
        self.pause_on_push: PauseMode | None = pause_on_push
        self.engine_down_s, self.progress = engine_down_s, progress
        self.client: RolloutClient | None = None
        self.started = False  # groups started (`rollouts`)
        self.interrupted = False
        self._lock = threading.Lock()  # the client is not closed while its cursor is read
        self._cursor: dict[str, Any] | None = None  # the client's cursor when it was closed
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._checked_at = 0.0
        self._engine_down_since: float | None = None
        if isinstance(engine, EngineReplicas):  # a replica that failed a push leaves every gateway
            engine.on_take_out.append(self._take_out_engine)

    @property
    def gateway(self) -> Gateway | None:
        """The gateway in this process (rollout=local) while the rollouts run; None otherwise."""
        return self.client.gateway if self.client is not None else None

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> Self:
        """Start (or connect to) the engine and connect the backend's rollout client. Idempotent;
        a failure stops what was started."""
        if self.client is not None:
            return self
        try:
            t0 = time.monotonic()
            self.engine.start()
            log.info("engine ready: %s at %s (%.1f s)", type(self.engine).__name__, self.engine.url,
                     time.monotonic() - t0)  # fmt: skip
            setup = self.rollout_setup()
            self.client = self.backend.connect(setup)
            if self.client.gateway is not None:
                log.info("gateway ready: %s, traces in %s", self.client.gateway.url, setup.store_path)
            else:
                log.info(
                    "rollouts ready: %s, traces next to %s", type(self.client).__name__, setup.store_path
                )
        except BaseException:
            self.stop()
            raise
        return self

    def rollout_setup(self) -> RolloutSetup:
        """What this run's rollouts need, wherever they run (the backend's `connect` takes it)."""
        return RolloutSetup(
            stages=self.stages(),
            tasks=self.tasks,
            group_size=self.group_size,
            sizes=self.sizes,
            max_groups_in_flight=self.max_groups_in_flight,
            group_deadline_s=self.group_deadline_s,
            engine_urls=tuple(self.engine.urls),
            store_path=self.store_path or self._tmp_store(),
            gateway_options=self.gateway_kwargs(),
        )

    def gateway_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of a `Gateway` in front of this engine: `gateway_options`, with the
        engine's model directory as `tokenizer_dir` unless set (token-faithful prompts)."""
        options = dict(self.gateway_options)
        if self.engine.model_dir is not None:
            options.setdefault("tokenizer_dir", str(self.engine.model_dir))
        return options

    def stages(self) -> HarnessStages:
        """The recipe of the stage functions on a gateway (sandbox, harness, evaluator, builder)."""
        return HarnessStages(self.sandbox, self.harness, self.evaluator, self.builder, self.options)

    def rollouts(self, cursor: dict[str, Any] | None = None) -> RolloutClient:
        """The rollout client with groups started: on the first call, from `cursor` (a resume
        cursor; None: a fresh run). After `interrupt` it raises `RolloutsStopped`."""
        if self.interrupted:
            raise RolloutsStopped("the run is shutting down: no new rollouts")
        assert self.client is not None, "start() first"
        if not self.started:
            self.client.health = self.health
            self.client.start_groups(cursor or {})
            self.started = True
        return self.client

    def stop_rollouts(self, timeout: float = 60.0) -> None:
        """Close the rollouts (sandboxes and sessions cleaned, the gateway flushed); the engine keeps
        serving. The client's cursor is kept (`cursor`): a checkpoint after this still needs it."""
        with self._lock:
            if self.client is None:
                return
            try:
                if self.started:
                    self._cursor = self.client.state_dict()
            except Exception:  # a lost controller: the last checkpoint's cursor stands
                log.exception("rollouts: no resume cursor at stop")
            try:
                self.client.close(timeout)
            finally:
                self.client, self.started = None, False

    def stop(self) -> None:
        """Stop the rollouts, then the engine. Idempotent; also after an error or an interrupt."""
        for step in (self.stop_rollouts, self.engine.stop):
            try:
                step()
            except Exception:
                log.exception("stop: %s failed", getattr(step, "__name__", step))
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def close(self) -> None:
        """`stop`, then the evaluator and the sandbox factory (their hosts): the end of the run."""
        self.stop()
        for part in (
            self.evaluator,
            self.sandbox,
        ):  # the evaluator first: its sandboxes use the factory's hosts
            close = getattr(part, "close", None)
            if close is not None:
                close()

    def interrupt(self, harness_grace_s: float = 10.0) -> None:
        """Admit no new rollout from now on and cancel the running ones (their harnesses are
        killed with their sandboxes), off the calling thread: safe from a signal handler.
        harness_grace_s: how long the cancelled jobs' cleanups may take."""
        self.interrupted = True
        client = self.client
        if client is not None:
            client.stop_feeding()
        threading.Thread(
            target=self.stop_rollouts, args=(harness_grace_s,), name="rollouts-interrupt", daemon=True
        ).start()

    # ---- while the rollouts run -----------------------------------------------------------
    def health(self) -> str | None:
        """Why no rollout can succeed any more (engine or gateway down), or None; checked at most
        every 2 s while a consumer waits for groups."""
        now = time.monotonic()
        if now - self._checked_at < 2.0:
            return None
        self._checked_at = now
        gateway = self.gateway
        if gateway is not None and not gateway.alive:
            return "the gateway's server stopped"
        if self.engine.health():
            self._engine_down_since = None
            return None
        self._engine_down_since = self._engine_down_since or now
        down = now - self._engine_down_since
        if down < self.engine_down_s:
            return None
        return f"the engine at {self.engine.url} has not answered its health check for {down:.0f} s"

    def push_target(self) -> PausingEngine:
        """What a weight sync pushes to: the engine, with the gateways paused meanwhile."""
        return PausingEngine(self.engine, lambda: self.client, self.pause_on_push)

    def policy_version(self) -> int:
        return int(self.engine.policy_version())

    def live_metrics(self) -> dict[str, float]:
        """Stage gauges for the live display (empty until groups start)."""
        client = self.client
        return client.metrics() if self.started and client is not None else {}

    def mark_consumed(self, seqs: Sequence[int]) -> None:
        """A training step used these groups: a resumed run skips them."""
        with self._lock:  # not while an interrupt is closing the rollouts
            if seqs and self.started and self.client is not None:
                self.client.mark_consumed(seqs)

    def cursor(self) -> dict[str, Any] | None:
        """The resume cursor: the running client's, else the one kept when it closed (None: none)."""
        with self._lock:
            if self.started and self.client is not None:
                return self.client.state_dict()
            return self._cursor

    def _take_out_engine(self, url: str) -> None:
        if self.client is not None:
            self.client.take_out_engine(url)

    def _tmp_store(self) -> str:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="polar-traces-")
        return str(Path(self._tmp.name) / "traces.db")


@runtime_checkable
class RolloutFeed(Protocol):
    """What the GRPO module and the callbacks read of the DataModule that feeds the trainer
    (`RolloutDataModule` implements it; `feed_of` finds it on a trainer)."""

    steps: int  # batches over the whole run
    batches_done: int  # batches a training step consumed (survives resume)
    wait_total_s: float  # trainer time blocked on rollouts, over the run

    @property
    def runtime(self) -> RolloutRuntime:
        """The run's rollout runtime."""

    @property
    def last_metrics(self) -> dict[str, float]:
        """Rollout metrics of the batch being trained now."""

    @property
    def last_groups(self) -> list[Group]:
        """The groups of the batch being trained now."""


def feed_of(trainer: object) -> RolloutFeed | None:
    """The trainer's DataModule when it feeds rollouts (Lightning sets `trainer.datamodule` at fit),
    else None: a plain dataloader, or no trainer attached."""
    dm = trainer.datamodule if hasattr(trainer, "datamodule") else None
    return dm if isinstance(dm, RolloutFeed) else None
