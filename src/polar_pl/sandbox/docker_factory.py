"""`sandbox=docker`: the factory the rollout pools and the evaluator call for each fresh sandbox.

One factory per run holds what the sandboxes share: the host pool (placement, capacity, health;
hosts.py) and, per host, the image cache (images.py) with its pull/build de-duplication and the
`max_pulls` bound. `factory()` gives a sandbox from the base image, `factory(image=...,
image_context=...)` one from a task's image; `prefetch([(image, context), ...])` starts making
images present on every healthy host ahead of need (the rollout service calls it for the next
`prefetch_tasks` tasks of its cursor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polar_pl.sandbox.docker import DockerSandbox, default_host
from polar_pl.sandbox.hosts import HostPool, images_options
from polar_pl.sandbox.image import DEFAULT_TAG
from polar_pl.sandbox.infra import RetryPolicy


class DockerSandboxes:
    """Makes `DockerSandbox`es on a pool of Docker hosts. Keyword arguments not named here
    (memory, pids, cpus, owner, harness_prefix, node, pydeps, default_timeout) go to each sandbox."""

    per_task_images = True

    def __init__(
        self,
        image: str = DEFAULT_TAG,
        docker_host: str | None = None,
        docker_hosts: Sequence[str | Mapping[str, Any]] | None = None,
        registry: str | None = None,
        docker_config: str | None = None,
        max_pulls: int = 2,
        prefetch_tasks: int = 4,
        retries: RetryPolicy | Mapping[str, Any] | int | None = None,
        health_interval_s: float = 5.0,
        build_timeout_s: float = 1800.0,
        **sandbox_options: Any,
    ) -> None:
        if prefetch_tasks < 0:
            raise ValueError(f"sandbox.prefetch_tasks={prefetch_tasks}: must be 0 (off) or more")
        self.image = image or DEFAULT_TAG
        self.retries = RetryPolicy.of(retries)
        self.prefetch_tasks = prefetch_tasks
        hosts = list(docker_hosts or [docker_host or default_host()])
        images = images_options(registry, docker_config, max_pulls, self.retries, build_timeout_s)
        self.pool = HostPool(hosts, images=images, health_interval_s=health_interval_s)
        self.sandbox_options = dict(sandbox_options)

    def __call__(
        self, image: str | None = None, image_context: str | None = None, owned_paths: tuple[str, ...] = ()
    ) -> DockerSandbox:
        return DockerSandbox(
            image=image or self.image,
            image_context=image_context,
            owned_paths=owned_paths,
            pool=self.pool,
            retries=self.retries,
            **self.sandbox_options,
        )

    def prefetch(self, images: Sequence[tuple[str, str | None]]) -> None:
        """Start pulls / builds of `images` on every host believed healthy; returns at once."""
        for host in self.pool.hosts:
            if host.healthy:
                for name, context in images:
                    host.images.prefetch(name, context)

    def image_wait_s(self) -> float:
        """Seconds sandbox starts spent blocked on an image, summed over sessions and hosts."""
        return sum(h.images.wait_s for h in self.pool.hosts)

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {"sandbox/image_wait_s": self.image_wait_s()}
        for i, h in enumerate(self.pool.hosts):
            m[f"sandbox/host{i}/active"] = h.active
            m[f"sandbox/host{i}/healthy"] = float(h.healthy)
            for how, n in h.images.counts.items():
                m[f"sandbox/images_{how}"] = m.get(f"sandbox/images_{how}", 0) + n
        return m

    def close(self) -> None:
        self.pool.close()
