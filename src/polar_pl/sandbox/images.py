"""Per-task images on one Docker engine: found locally, else pulled, else built; once per image.

`ImageCache.ensure(name, context)` makes `name` present on its engine: an image already there is
used as is; otherwise it is pulled from `registry` (credentials from the Docker config, as the
`docker` CLI reads them) and tagged `name`; if that fails and the task has a build context (a
directory holding a Dockerfile) it is built. Each image is resolved once however many sessions
ask: concurrent callers share one future, at most `max_pulls` pulls/builds run at once, and a
resolved image stays resolved. `prefetch` starts the same work without waiting, so that INIT of a
later task finds its image ready. Failures are retried (`RetryPolicy`) and end in
`InfraError("image")`; a failed image is forgotten, so a later task tries again.

Naming schemes of the public datasets (for rows that carry no image field):
`swebench_image(id)` is SWE-bench's `<namespace>/sweb.eval.x86_64.<id>:latest` with `__` spelled
`_1776_` (Docker Hub refuses dunders), lower-cased; `swegym_image(id)` is SWE-Gym's
`xingyaoww/sweb.eval.x86_64.<id>` with `__` spelled `_s_`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from polar_pl.sandbox.image import DEFAULT_TAG, build_image
from polar_pl.sandbox.infra import InfraError, RetryPolicy, with_retries

log = logging.getLogger(__name__)


def swebench_image(instance_id: str, namespace: str = "swebench", tag: str = "latest") -> str:
    return f"{namespace}/sweb.eval.x86_64.{instance_id}:{tag}".replace("__", "_1776_").lower()


def swegym_image(instance_id: str, namespace: str = "xingyaoww", tag: str = "latest") -> str:
    return f"{namespace}/sweb.eval.x86_64.{instance_id}:{tag}".replace("__", "_s_").lower()


def split_reference(name: str) -> tuple[str | None, str, str]:
    """(registry host or None, repository, tag) of an image reference, as the docker CLI splits it:
    the first path component is a registry when it has a '.' or ':' or is 'localhost'."""
    repo, tag = name, "latest"
    last = name.rsplit("/", 1)[-1]
    if ":" in last and "@" not in last:
        repo, tag = name.rsplit(":", 1)
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return None, repo, tag


@dataclass(frozen=True, slots=True)
class ImageEvent:
    """How one image was made present: `hit` (already there), `pull`, `build` or `import` (the
    offline base image); seconds taken."""

    name: str
    how: str
    seconds: float
    done_at: float = 0.0  # monotonic time it became present


class ImageCache:
    """Image resolution for one engine. `client_factory()` returns a docker client for it (called in
    the worker threads; the SDK's clients are not shared across threads here)."""

    def __init__(
        self,
        client_factory,
        *,
        registry: str | None = None,
        docker_config: str | None = None,
        max_pulls: int = 2,
        retries: RetryPolicy | None = None,
        build_timeout_s: float = 1800.0,
    ) -> None:
        if max_pulls < 1:
            raise ValueError(f"sandbox.max_pulls={max_pulls}: must be at least 1")
        self.client_factory = client_factory
        self.registry = registry.rstrip("/") if registry else None
        self.docker_config = docker_config
        self.retries = retries or RetryPolicy()
        self.build_timeout_s = build_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max_pulls, thread_name_prefix="polar-image")
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._base_lock = threading.Lock()  # one import of the base image at a time
        self.events: list[ImageEvent] = []
        self.counts: Counter[str] = Counter()  # hit / pull / build / failed
        self.wait_s = 0.0  # summed time callers of ensure() spent blocked on an image
        self.waits: list[tuple[float, float, str]] = []  # (monotonic start, seconds blocked, image)

    # -- API ---------------------------------------------------------------------------------
    def prefetch(self, name: str, context: str | None = None) -> Future:
        """Start making `name` present (no-op when it is or is on its way); returns its future."""
        with self._lock:
            fut = self._futures.get(name)
            if fut is None:
                fut = self._pool.submit(self._resolve, name, context)
                self._futures[name] = fut
                fut.add_done_callback(lambda f: self._forget_failed(name, f))
            return fut

    def ensure(self, name: str, context: str | None = None) -> str:
        """Block until `name` is present on the engine; returns it. Raises InfraError("image")."""
        t0 = time.monotonic()
        fut = self.prefetch(name, context)
        try:
            fut.result()
        finally:
            waited = time.monotonic() - t0  # microseconds when the image was ready
            with self._lock:
                self.wait_s += waited
                self.waits.append((t0, waited, name))
        return name

    def ready(self, name: str) -> bool:
        fut = self._futures.get(name)
        return fut is not None and fut.done() and fut.exception() is None

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- work --------------------------------------------------------------------------------
    def _forget_failed(self, name: str, fut: Future) -> None:
        if fut.exception() is not None:
            with self._lock:
                if self._futures.get(name) is fut:
                    del self._futures[name]

    def _resolve(self, name: str, context: str | None) -> ImageEvent:
        t0 = time.monotonic()
        client = self.client_factory()
        try:
            how = self._make_present(client, name, context)
        except InfraError:
            self.counts["failed"] += 1
            raise
        finally:
            client.close()
        event = ImageEvent(name, how, time.monotonic() - t0, time.monotonic())
        self.events.append(event)
        self.counts[how] += 1
        log.info("image %s: %s in %.1fs", name, how, event.seconds)
        return event

    def _make_present(self, client, name: str, context: str | None) -> str:
        import docker

        def present() -> bool:
            try:
                client.images.get(name)
                return True
            except docker.errors.ImageNotFound:
                return False

        if with_retries(present, self.retries, "image", f"looking up {name}"):
            return "hit"
        if name == DEFAULT_TAG:  # the offline base image is imported from its rootfs tarball, not pulled
            with self._base_lock:
                with_retries(lambda: build_image(client, name), self.retries, "image", f"importing {name}")
            return "import"
        pull_error: InfraError | None = None
        try:
            with_retries(lambda: self._pull(client, name), self.retries, "image", f"pulling {name}")
            return "pull"
        except InfraError as exc:
            pull_error = exc
        if context is None:
            raise pull_error
        try:
            with_retries(
                lambda: self._build(client, name, context), self.retries, "image", f"building {name}"
            )
        except InfraError as exc:
            raise InfraError("image", f"{name}: pull failed ({pull_error}); build failed ({exc})") from exc
        return "build"

    def _pull(self, client, name: str) -> None:
        host, repo, tag = split_reference(name)
        source = f"{host}/{repo}" if host else (f"{self.registry}/{repo}" if self.registry else repo)
        auth = self._auth(host or (self.registry.split("/")[0] if self.registry else "docker.io"))
        client.images.pull(source, tag=tag, auth_config=auth)
        if not host and source != repo:  # pulled from the registry: tag it with the task's name
            client.api.tag(f"{source}:{tag}", repo, tag)

    def _auth(self, registry: str) -> dict | None:
        """Credentials for `registry` from the Docker config ($DOCKER_CONFIG/config.json, or
        ~/.docker/config.json; `sandbox.docker_config` names another file), credential helpers too."""
        from docker import auth

        config = auth.load_config(config_path=self.docker_config)
        return auth.resolve_authconfig(config, registry) or None

    def _build(self, client, name: str, context: str) -> None:
        import docker

        ctx = Path(context)
        if not (ctx / "Dockerfile").is_file():
            raise InfraError("image", f"build context {ctx} has no Dockerfile")
        for base in base_images((ctx / "Dockerfile").read_text()):
            self._make_present(client, base, None)  # in this thread: a queued prefetch could deadlock
        try:
            # network_mode none: a build gets no network either (the test engines have no bridge)
            client.images.build(
                path=str(ctx),
                tag=name,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                timeout=self.build_timeout_s,
                labels={IMAGE_LABEL: "1"},
            )
        except docker.errors.BuildError as exc:
            tail = "".join(str(c.get("stream", c.get("error", ""))) for c in list(exc.build_log)[-8:])
            raise docker.errors.BuildError(f"{exc.msg}\n{tail.strip()[-1500:]}", exc.build_log) from None


IMAGE_LABEL = "polar_pl.image"  # on images this cache built (what `polar-pl sandbox gc` may remove)
# names of per-task images that gc may remove when no task set needs them (pulled ones carry no label)
TASK_IMAGE_PATTERNS = ("polar-pl/harbor-", "sweb.eval.")
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)", re.IGNORECASE | re.MULTILINE)


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile starts FROM, except build stages and `scratch`."""
    stages = set(re.findall(r"^\s*FROM\s+.*\s+AS\s+(\S+)", dockerfile, re.IGNORECASE | re.MULTILINE))
    out = []
    for ref in _FROM.findall(dockerfile):
        if ref.lower() != "scratch" and ref not in stages and "$" not in ref and ref not in out:
            out.append(ref)
    return out


def image_size(client, name: str) -> int:
    """Bytes of an image on the engine (0 when absent)."""
    import docker

    try:
        return int(client.images.get(name).attrs.get("Size", 0))
    except docker.errors.ImageNotFound:
        return 0
