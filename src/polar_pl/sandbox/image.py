"""The Docker base image, built offline: debootstrap a minimal Debian (python3, git), import it.

No registry is reachable, so there is no `FROM`: `debootstrap --variant=minbase` fetches .deb files
from the Debian mirror (the one package source this machine has), the rootfs is packed into a
tarball cached on disk, and `docker import` turns it into an image. The tarball is built once per
machine; importing it into a fresh engine takes seconds. The host's Node binary and the harness
CLIs are not in the image: they are mounted read-only from the host at run time, and so is a
`pip --target` folder with the mini agent's Python dependencies (`openai`).

The image sets no USER: a task's Dockerfile built FROM it runs its build steps as root, as in any
Dockerfile (`RUN apt-get install ...`, `RUN printf ... > /app/file`). Who runs in a container is
chosen when the sandbox starts it, never baked into an image: the unprivileged `polar` user
(uid 1000) for every exec, with HOME=/home/polar (docker.py); build steps keep root's HOME, so
what they cache there is not left root-owned in the agent's home.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from polar_pl.utils.locks import file_lock

DEFAULT_TAG = "polar-pl/sandbox:bookworm"
SUITE = "bookworm"  # the host's Debian: same python3.11 and glibc as the pydeps folder and Node
PACKAGES = ("python3", "git", "ca-certificates", "procps", "patch", "less")
USER_UID = 1000
MINI_DEPS = ("openai",)


def cache_dir() -> Path:
    return Path(os.environ.get("POLAR_SANDBOX_CACHE", ".cache/sandbox")).resolve()


def rootfs_tarball(cache: Path | None = None, mirror: str | None = None) -> Path:
    """The cached rootfs tarball, built with debootstrap when missing (root, ~2 minutes)."""
    cache = cache or cache_dir()
    out = cache / f"rootfs-{SUITE}.tar"
    with file_lock(out):
        if not out.exists():
            _debootstrap(out, cache, mirror)
    return out


def _debootstrap(out: Path, cache: Path, mirror: str | None) -> None:
    if os.geteuid() != 0:
        raise RuntimeError("building the sandbox rootfs needs root (debootstrap)")
    if not shutil.which("debootstrap"):
        env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True, env=env)
    cache.mkdir(parents=True, exist_ok=True)
    mirror = mirror or os.environ.get("POLAR_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        root = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(root),
            mirror,
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        _add_user(root)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / junk, ignore_errors=True)
        partial = out.with_suffix(".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(root, arcname=".")
        partial.rename(out)


def _add_user(root: Path) -> None:
    """An unprivileged `polar` user (uid 1000) owning /workspace and /home/polar."""
    with open(root / "etc/passwd", "a") as f:
        f.write(f"polar:x:{USER_UID}:{USER_UID}:polar:/home/polar:/bin/bash\n")
    with open(root / "etc/group", "a") as f:
        f.write(f"polar:x:{USER_UID}:\n")
    for d in ("workspace", "home/polar", "opt/polar"):
        (root / d).mkdir(parents=True, exist_ok=True)
        os.chown(root / d, USER_UID, USER_UID)


def default_harness_prefix(given: str | None = None) -> str | None:
    """The host folder with the installed harness CLIs: `given`, else $POLAR_HARNESS_PREFIX, else
    ./.cache/harness when it exists (where `make test` installs them); absolute, or None."""
    prefix = given or os.environ.get("POLAR_HARNESS_PREFIX")
    if not prefix and Path(".cache/harness").is_dir():
        prefix = ".cache/harness"
    return str(Path(prefix).resolve()) if prefix else None


def mounted_harness_prefix(given: str | None = None) -> str | None:
    """What a sandbox mounts as the harness prefix: `default_harness_prefix` when that folder
    exists, else None (left out). bwrap and Docker refuse a missing source, and so every exec of
    every sandbox failed, the mini agent's too, which needs no CLI; a harness that does need the
    prefix is refused at start-up instead (`training.check_harness_prefix`)."""
    prefix = default_harness_prefix(given)
    return prefix if prefix and os.path.isdir(prefix) else None


def pydeps_dir(cache: Path | None = None) -> Path:
    """A `pip install --target` folder with the mini agent's dependencies, for mounting read-only."""
    cache = cache or cache_dir()
    out = cache / "pydeps"
    with file_lock(out):
        if not (out / ".complete").exists():
            _pip_target(out)
    return out


def _pip_target(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    pins = []
    for name in MINI_DEPS:
        try:
            pins.append(f"{name}=={metadata.version(name)}")  # the version the host tests with
        except metadata.PackageNotFoundError:
            pins.append(name)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", str(out), *pins]
    subprocess.run(cmd, check=True)
    (out / ".complete").write_text(" ".join(pins) + "\n")


def _current(client, tag: str) -> bool:
    """Whether the engine holds the base image as this code imports it. One imported before build
    steps ran as root ends with USER 1000:1000 (issue 32): it is imported again."""
    import docker

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return not (image.attrs.get("Config") or {}).get("User")


def build_image(client, tag: str = DEFAULT_TAG, cache: Path | None = None, force: bool = False) -> str:
    """Import the base image into the engine behind `client` unless it is there; returns the tag."""
    if not force and _current(client, tag):
        return tag
    tarball = rootfs_tarball(cache)
    repo, _, version = tag.partition(":")
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        "WORKDIR /workspace",
        'CMD ["sleep", "infinity"]',
    ]
    client.api.import_image_from_file(str(tarball), repository=repo, tag=version or "latest", changes=changes)
    client.images.get(tag)
    return tag
