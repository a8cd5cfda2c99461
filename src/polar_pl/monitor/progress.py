"""Live stage counts while rollouts run (rich), refreshed from the rollout service's gauges."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Self

from rich.console import Console
from rich.live import Live
from rich.table import Table

STAGES = ("init", "running", "postrun")
log = logging.getLogger(__name__)


def render(m: dict[str, float], title: str = "rollouts") -> Table:
    t = Table(title=title, expand=False)
    for col in ("stage", "active", "queued", "busy"):
        t.add_column(col, justify="right")
    queued = {
        "init": m.get("pool/init_queue", 0),
        "running": m.get("pool/ready_queue", 0),
        "postrun": m.get("pool/postrun_queue", 0),
    }
    for s in STAGES:
        t.add_row(
            s.upper(),
            f"{m.get(f'pool/{s}_active', 0):.0f}",
            f"{queued[s]:.0f}",
            f"{m.get(f'pool/{s}_busy', 0):.0%}",
        )
    done = ", ".join(
        f"{k.removeprefix('pool/sessions_')}={v:.0f}"
        for k, v in sorted(m.items())
        if k.startswith("pool/sessions_")
    )
    t.caption = f"sessions: {done or 'none yet'} · groups ready: {m.get('pool/groups_ready', 0):.0f}"
    return t


def waiting_line(waited_s: float, batch: str, m: dict[str, float], last_failure: str | None) -> str:
    """One line on what a trainer waiting for rollouts waits on, from the rollout client's
    gauges: attempts in a stage, finished ones by status, and the last failure's reason."""
    active = {s: int(m.get(f"pool/{s}_active", 0)) for s in STAGES}
    prefix = "pool/sessions_"
    finished = {k.removeprefix(prefix): int(v) for k, v in sorted(m.items()) if k.startswith(prefix) and v}
    failed = sum(n for status, n in finished.items() if status not in ("ok", "timeout"))
    stages = ", ".join(f"{s} {n}" for s, n in active.items())
    by_status = f" ({', '.join(f'{k} {v}' for k, v in finished.items())})" if finished else ""
    return (
        f"waiting {waited_s:.0f} s for {batch}: rollouts {sum(active.values())} in progress ({stages}), "
        f"{sum(finished.values())} finished{by_status}, {failed} failed; "
        f"last failure: {last_failure or 'none'}"
    )


def _follow_redirect() -> list[tuple[logging.StreamHandler, object]]:
    """Point the log handlers that write to the terminal at Live's stdout/stderr proxies, so log
    lines (the per-step line, start-up lines) print above the table instead of through it.
    Returns (handler, original stream) pairs to restore."""
    moved = []
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler:  # not FileHandler (a subclass)
            for orig, proxy in ((sys.__stdout__, sys.stdout), (sys.__stderr__, sys.stderr)):
                if handler.stream is orig and proxy is not orig:
                    moved.append((handler, handler.setStream(proxy)))
    return moved


class LiveProgress:
    """`with LiveProgress(service.metrics): ...` — redraws every `period` seconds on a thread.

    Disabled (a no-op) when the console is not a terminal, so logs and CI stay clean.
    """

    def __init__(
        self,
        source: Callable[[], dict[str, float]],
        period: float = 0.5,
        title: str = "rollouts",
        console: Console | None = None,
    ) -> None:
        self.source, self.period, self.title = source, period, title
        self.console = console or Console()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        with Live(render({}, self.title), console=self.console, refresh_per_second=4, transient=True) as live:
            moved = _follow_redirect()
            try:
                self._refresh(live)
            finally:
                for handler, stream in moved:
                    handler.setStream(stream)

    def _refresh(self, live: Live) -> None:
        while not self._stop.wait(self.period):
            try:
                live.update(render(self.source(), self.title))
            except Exception:
                log.debug("progress refresh failed", exc_info=True)

    def __enter__(self) -> Self:
        if self.console.is_terminal:
            self._thread = threading.Thread(target=self._loop, name="live-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
