"""TaskQueue: a task feed that grows while rollouts run (tasks submitted to `polar-pl rollout serve`).

`RolloutService` feeds group `seq` from `tasks[seq]` once the queue holds it (`await wait(seq)`),
instead of cycling over a fixed source; so every submitted task becomes exactly one group.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from typing import Any, overload


class TaskQueue(Sequence[Any]):
    """Thread-safe, append-only; `put` from any thread, `wait` on the service's event loop. A
    `Sequence` of the tasks submitted so far, so it stands wherever a task source does."""

    def __init__(self, tasks: Iterable[Any] = ()) -> None:
        self._tasks: list[Any] = list(tasks)
        self._lock = threading.Lock()

    def put(self, tasks: Iterable[Any]) -> list[int]:
        """Append tasks; returns their group seqs (one group of G attempts each)."""
        with self._lock:
            start = len(self._tasks)
            self._tasks.extend(tasks)
            return list(range(start, len(self._tasks)))

    async def wait(self, seq: int, poll_s: float = 0.05) -> None:
        while len(self) <= seq:
            await asyncio.sleep(poll_s)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tasks)

    @overload
    def __getitem__(self, seq: int) -> Any: ...

    @overload
    def __getitem__(self, seq: slice) -> list[Any]: ...

    def __getitem__(self, seq: int | slice) -> Any:
        with self._lock:
            return self._tasks[seq]

    def __getstate__(self) -> dict[str, Any]:  # travels to a Ray controller: without its lock
        return {"tasks": list(self._tasks)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._tasks, self._lock = state["tasks"], threading.Lock()
