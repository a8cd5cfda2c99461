"""The engine gate: in-flight engine calls, engine busy time, and the weight-update pause.

Every engine call passes the gate before it is sent (`enter`) and leaves it when its engine stream
is finished (`leave`). A trainer pushing new weights pauses the gate: NEW engine calls wait at the
gate (the harness just sees a slower answer) until `resume`, or until `wait_timeout` runs out, and
then get a provider-shaped 503 / 529 with Retry-After. `pause("drain")` also waits until the calls
already in flight have finished (the engine is idle when it returns), for at most `timeout`
seconds (`DrainTimeout` says how many calls it waited for and how many are still running; the
gate stays paused); `pause("keep")` returns at once and lets them continue (their tokens carry
the policy version of each chunk). Both return a `PauseReport`.

All state lives on the gateway's event loop; `Gateway.pause` / `resume` reach it from other
threads with `run_coroutine_threadsafe`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Literal

PauseMode = Literal["drain", "keep"]
PAUSE_MODES = ("drain", "keep")


@dataclass(frozen=True, slots=True)
class PauseReport:
    """What a pause waited for: the calls in flight when it came, those still in flight now."""

    mode: str
    waited_for: int
    in_flight: int
    waited_s: float

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


class DrainTimeout(TimeoutError):
    def __init__(self, report: PauseReport):
        super().__init__(
            f"drain timed out after {report.waited_s:.1f}s: waited for {report.waited_for} engine "
            f"calls, {report.in_flight} still in flight (the gateway stays paused)"
        )
        self.report = report


class BusyClock:
    """Wall time with at least one engine call in flight, as a fraction of time since start."""

    def __init__(self) -> None:
        self.count = 0
        self._start = self._last = time.monotonic()
        self._busy = 0.0

    def _advance(self) -> None:
        now = time.monotonic()
        if self.count > 0:
            self._busy += now - self._last
        self._last = now

    def enter(self) -> None:
        self._advance()
        self.count += 1

    def leave(self) -> None:
        self._advance()
        self.count -= 1

    def fraction(self) -> float:
        self._advance()
        span = self._last - self._start
        return self._busy / span if span > 0 else 0.0

    def seconds(self) -> tuple[float, float]:
        """(busy seconds, wall seconds) since start: difference two readings for a window."""
        self._advance()
        return self._busy, self._last - self._start


class EngineGate:
    """See the module docstring. Not thread-safe: use it from the gateway's loop only."""

    def __init__(self, wait_timeout: float = 300.0) -> None:
        self.wait_timeout = wait_timeout
        self.clock = BusyClock()
        self.paused = False
        self.waiting = 0  # calls held at the gate right now
        self.held_total = 0  # calls that ever had to wait
        self.refused = 0  # calls that waited past wait_timeout
        self.paused_s = 0.0
        self._paused_at = 0.0
        self._open: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._open is None:  # created on the loop that uses them
            self._open, self._idle = asyncio.Event(), asyncio.Event()
            if not self.paused:
                self._open.set()
            if self.clock.count == 0:
                self._idle.set()
        assert self._idle is not None  # created with _open
        return self._open, self._idle

    @property
    def in_flight(self) -> int:
        return self.clock.count

    async def enter(self) -> bool:
        """Admit one engine call (waiting while paused); False when the wait timed out."""
        opened, idle = self._events()
        if self.paused:
            self.waiting += 1
            self.held_total += 1
            deadline = time.monotonic() + self.wait_timeout
            try:
                while self.paused:  # a pause right after a resume sends us back to waiting
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.refused += 1
                        return False
                    try:
                        async with asyncio.timeout(left):
                            await opened.wait()
                    except TimeoutError:
                        continue
            finally:
                self.waiting -= 1
        self.clock.enter()
        idle.clear()
        return True

    def leave(self) -> None:
        self.clock.leave()
        if self.clock.count == 0:
            self._events()[1].set()

    async def pause(self, mode: PauseMode = "drain", timeout: float | None = None) -> PauseReport:
        """timeout: seconds a drain may wait (None: `wait_timeout`, what a held call waits)."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode: {mode!r}; allowed: {', '.join(PAUSE_MODES)}")
        opened, idle = self._events()
        if not self.paused:
            self.paused = True
            self._paused_at = time.monotonic()
            opened.clear()
        t0, waited_for = time.monotonic(), self.in_flight
        if mode == "drain":
            try:
                async with asyncio.timeout(self.wait_timeout if timeout is None else timeout):
                    await idle.wait()
            except TimeoutError:
                raise DrainTimeout(
                    PauseReport(mode, waited_for, self.in_flight, time.monotonic() - t0)
                ) from None
        return PauseReport(mode, waited_for, self.in_flight, time.monotonic() - t0)

    def resume(self) -> None:
        opened, _ = self._events()
        if self.paused:
            self.paused = False
            self.paused_s += time.monotonic() - self._paused_at
            opened.set()

    def snapshot(self) -> dict[str, float]:
        paused_s = self.paused_s + (time.monotonic() - self._paused_at if self.paused else 0.0)
        busy_s, wall_s = self.clock.seconds()
        return {
            "gateway/in_flight": float(self.in_flight),
            "gateway/engine_busy": busy_s / wall_s if wall_s > 0 else 0.0,
            "gateway/engine_busy_s": busy_s,
            "gateway/uptime_s": wall_s,
            "gateway/paused": float(self.paused),
            "gateway/paused_s": paused_s,
            "gateway/gate_waiting": float(self.waiting),
            "gateway/gate_held": float(self.held_total),
            "gateway/gate_refused": float(self.refused),
        }
