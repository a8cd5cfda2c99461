"""Infrastructure failures: what is retried, and how a failure that outlived its retries is told apart.

A sandbox that cannot start, an image that cannot be pulled or built, an exec or a copy that the
Docker engine did not carry out: none of these says anything about the policy. They are retried
with exponential backoff (`sandbox.retries`); what still fails raises `InfraError`, which the stage
pools record as status `infra_failure` (masked from training, counted per kind in
`rollout/infra_failures/<kind>`), never as a model failure with reward 0.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

INFRA_KINDS = ("start", "image", "exec", "copy", "host")
T = TypeVar("T")


class InfraError(RuntimeError):
    """An infrastructure operation failed after its retries. `kind` is one of INFRA_KINDS."""

    def __init__(self, kind: str, message: str, attempts: int = 1) -> None:
        assert kind in INFRA_KINDS, kind
        super().__init__(f"{kind}: {message}" + (f" (after {attempts} attempts)" if attempts > 1 else ""))
        self.kind = kind
        self.attempts = attempts


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """attempts: tries in all (1 = no retry); backoff doubles from backoff_s up to max_backoff_s,
    with +-25% jitter so that sandboxes failing together do not retry in lockstep."""

    attempts: int = 3
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"sandbox.retries.attempts={self.attempts}: must be at least 1")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("sandbox.retries.backoff_s / max_backoff_s must not be negative")

    @classmethod
    def of(cls, value: RetryPolicy | Mapping[str, Any] | int | None) -> RetryPolicy:
        """From the config: a mapping of the fields, a bare number of attempts, or None (defaults)."""
        if isinstance(value, RetryPolicy):
            return value
        if value is None:
            return cls()
        if isinstance(value, int):
            return cls(attempts=value)
        return cls(**dict(value))

    def delay(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * random.uniform(0.75, 1.25)


def transient(exc: BaseException) -> bool:
    """Whether a Docker SDK / HTTP failure is the engine's or the network's, not the caller's: a
    connection error, a read timeout, a 5xx, or a container that vanished under us."""
    import docker
    import requests

    if isinstance(exc, InfraError):
        return True
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout | ConnectionError):
        return True
    if isinstance(exc, docker.errors.NotFound):
        return True
    if isinstance(exc, docker.errors.APIError):
        return exc.status_code is None or exc.status_code >= 500
    return isinstance(exc, docker.errors.BuildError | docker.errors.DockerException | OSError)


def with_retries(
    fn: Callable[[], T],
    policy: RetryPolicy,
    kind: str,
    what: str,
    *,
    retry_if: Callable[[BaseException], bool] = transient,
    on_failure: Callable[[BaseException], None] | None = None,
) -> T:
    """Call fn until it succeeds or `policy.attempts` are spent; raise InfraError(kind) then.
    Exceptions for which `retry_if` is false propagate at once, unchanged (they are not infra)."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if not retry_if(exc):
                raise
            if on_failure is not None:
                on_failure(exc)
            if attempt == policy.attempts:
                detail = exc if not isinstance(exc, InfraError) else exc.args[0].split(": ", 1)[-1]
                raise InfraError(kind, f"{what}: {type(exc).__name__}: {detail}", attempt) from exc
            delay = policy.delay(attempt)
            log.warning(
                "%s failed (%s: %s); retry %d/%d in %.1fs",
                what,
                type(exc).__name__,
                exc,
                attempt,
                policy.attempts - 1,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")
