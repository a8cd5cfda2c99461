"""The rollout client a trainer drives, the backend that connects one, and what a run needs.

    client = backend.connect(setup)        # gateways / workers up (RolloutRuntime.start)
    client.start_groups(cursor)            # feed groups from the resume cursor ({} on a fresh run)
    groups = client.next_groups(2, consume=False)
    ...train...; client.mark_consumed([g.seq for g in groups])
    client.pause("keep"); version = push(); client.set_policy_version(version); client.resume()
    client.close()

Everything in `RolloutSetup` is picklable: with `rollout=ray` it travels to every worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from polar_pl.engine.protocol import Engine
from polar_pl.gateway.call.gate import PauseMode
from polar_pl.gateway.handle import Gateway
from polar_pl.harness.protocol import Harness
from polar_pl.rollout.pools import PoolSizes, RolloutStages
from polar_pl.rollout.service import Group
from polar_pl.rollout.stages import HarnessRolloutStages, RolloutOptions
from polar_pl.sandbox.protocol import Sandbox
from polar_pl.tasks.evaluator import Evaluator
from polar_pl.trajectory.base import TrajectoryBuilder


@dataclass(frozen=True, slots=True)
class HarnessStages:
    """The recipe for `HarnessRolloutStages` on a given gateway (built where the sessions run)."""

    sandbox: Callable[[], Sandbox]
    harness: Harness
    evaluator: Evaluator
    builder: TrajectoryBuilder
    options: RolloutOptions = field(default_factory=RolloutOptions)

    def __call__(self, gateway: Gateway) -> RolloutStages:
        return HarnessRolloutStages(
            gateway, self.sandbox, self.harness, self.evaluator, self.builder, self.options
        )


@dataclass(frozen=True, slots=True)
class RolloutSetup:
    """What a run's rollouts need, wherever they run.

    stages: gateway -> RolloutStages (`HarnessStages`; the benchmarks pass simulated stages).
    engine_urls: the engine replicas every gateway routes to (none: the stages need no gateway).
    store_path: the trace store of the gateway (rollout=ray: one store per worker next to it).
    gateway_options: keyword arguments of `Gateway` (token-faithful tokenizer, response cap, ...).
    """

    stages: Callable[[Any], RolloutStages]
    tasks: Sequence[Any]
    group_size: int
    sizes: PoolSizes = field(default_factory=PoolSizes)
    max_groups_in_flight: int = 2
    group_deadline_s: float | None = None
    engine_urls: tuple[str, ...] = ()
    store_path: str = "traces.db"
    gateway_options: dict[str, Any] = field(default_factory=dict)

    def store_for(self, name: str) -> str:
        """A worker's own store next to the run's: traces.db -> traces-<name>.db."""
        p = Path(self.store_path)
        return str(p.with_name(f"{p.stem}-{name}{p.suffix or '.db'}"))

    def service_kwargs(self) -> dict[str, Any]:
        """The group bookkeeping arguments of `RolloutService`."""
        return {
            "group_size": self.group_size,
            "sizes": self.sizes,
            "max_groups_in_flight": self.max_groups_in_flight,
            "group_deadline_s": self.group_deadline_s,
        }


@runtime_checkable
class RolloutClient(Protocol):
    """Finished GRPO groups in, weight-push coordination out. Implemented in-process
    (`LocalClient`), through Ray (`RayClient`) and over HTTP (`RemoteClient`).

    gateway: the gateway in this process (rollout=local), None where the gateways run elsewhere.
    health: set by the trainer before `start_groups`: checked while `next_groups` waits, it says
        why no rollout can succeed any more (the engine or gateway is down; the wait then ends
        with `PartDown`). Backends whose parts run elsewhere watch them themselves and ignore it.
    """

    health: Callable[[], str | None] | None

    @property
    def gateway(self) -> Gateway | None: ...

    def start_groups(self, cursor: dict[str, Any]) -> None:
        """Called once, before the first `next_groups`, with the resume cursor (`state_dict()` of
        an earlier run; {} on a fresh one). Rollouts start here."""

    def next_groups(self, n: int, timeout: float | None = None, *, consume: bool = True) -> list[Group]:
        """Block until n groups are released (all G attempts finished, or the group deadline
        passed); oldest first. consume=False leaves the resume cursor to `mark_consumed`."""

    def mark_consumed(self, seqs: Sequence[int]) -> None:
        """Called after a training step used these groups: a resumed run skips them."""

    def submit_tasks(self, tasks: Sequence[Any]) -> list[int]:
        """Add tasks to a `TaskQueue` feed (one group each); returns their group seqs. A feed from
        a fixed task source refuses (TypeError)."""

    def state_dict(self) -> dict[str, Any]:
        """The resume cursor (`start_seq`, `skip_seqs`)."""

    def metrics(self) -> dict[str, float]:
        """Slash-keyed gauges: pool/*, gateway/*, rollout/* (workers, retries, masked sessions)."""

    def last_failure(self) -> str | None:
        """The latest failed attempt's stage and reason (None: none failed, or not known here):
        for the line the trainer prints while it waits for rollouts."""

    def pause(self, mode: PauseMode) -> None:
        """Before a weight push: new engine calls wait at every gateway ("drain": and the calls
        in flight finish first; "keep": they run on)."""

    def resume(self) -> None:
        """After a weight push: waiting and new engine calls go on."""

    def set_policy_version(self, version: int) -> None:
        """After a push, before `resume`: the version gateways record for engines that do not
        report one (vLLM)."""

    def take_out_engine(self, url: str) -> None:
        """An engine replica left rotation (it failed a weight push): no gateway routes to it."""

    def stop_feeding(self) -> None:
        """Admit no new rollout from now on; a waiting `next_groups` raises `RolloutsStopped`.
        Returns at once: called from a signal handler."""

    def close(self, timeout: float = 60.0) -> None:
        """Called at teardown, also after an error or an interrupt (timeout: how long the
        cancelled sessions' cleanups may take): every session ends, every sandbox is stopped.
        Idempotent."""


class RolloutBackend(Protocol):
    """A `rollout=` config choice: where the sessions of a run execute."""

    def engine(self) -> Engine | None:
        """The engine this backend brings (rollout=remote: a handle to the service's), or None:
        the run builds the `engine` group's."""

    def connect(self, setup: RolloutSetup) -> RolloutClient:
        """Called by `RolloutRuntime.start` once the engine is up: starts gateways and workers."""
