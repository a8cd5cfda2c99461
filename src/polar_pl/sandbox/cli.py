"""`polar-pl sandbox build-image` and `polar-pl sandbox cleanup`.

build-image: build the offline base image (debootstrap rootfs, cached under .cache/sandbox) and the
mini agent's pydeps folder, and import the image into a Docker engine: the one at --docker-host /
DOCKER_HOST, or a private dockerd (--dockerd-root) started for the import and stopped after.
dockerd: run the private engine in the foreground for `sandbox=docker` runs (DOCKER_HOST=...).
cleanup: remove leftover sandboxes after a crash: labelled containers, temporary workspaces,
relay folders and cgroups (of one --owner, or all).
images / gc: per-task images of task sets, made present ahead of a run / removed after (images_cli.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build-image", help="build the offline Docker base image (python3, git)")
    b.add_argument("--tag", default=None, help="image tag (default polar-pl/sandbox:bookworm)")
    b.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"), help="engine socket URL")
    b.add_argument(
        "--dockerd-root", default=".cache/dockerd", help="private dockerd root when no engine given"
    )
    b.add_argument("--force", action="store_true", help="re-import even if the tag exists")
    d = sub.add_parser("dockerd", help="run a private Docker engine in the foreground (prints DOCKER_HOST)")
    d.add_argument("--dockerd-root", default=".cache/dockerd", help="data root (keeps images)")
    c = sub.add_parser("cleanup", help="remove leftover sandboxes (containers, workspaces, cgroups)")
    c.add_argument("--owner", default=None, help="only sandboxes of this owner (default: all)")
    c.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"), help="engine socket URL")
    c.add_argument("--dockerd-root", default=None, help="also clean the private dockerd at this root")
    from polar_pl.sandbox import images_cli

    images_cli.add_arguments(sub)


def run(args: argparse.Namespace) -> int:
    from polar_pl.sandbox import images_cli

    actions = {
        "build-image": _build,
        "cleanup": _cleanup,
        "dockerd": _dockerd,
        "images": images_cli.images,
        "gc": images_cli.gc,
    }
    return actions[args.action](args)


def _dockerd(args: argparse.Namespace) -> int:
    from polar_pl.sandbox.dockerd import DockerDaemon, DockerUnavailable

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # dockerd runs in its own session (a terminal's Ctrl-C does not reach it), so only this
    # process can stop it: SIGTERM (kill, systemd, Kubernetes) must unwind through `stop` too.
    signal.signal(signal.SIGTERM, interrupted)
    daemon = DockerDaemon(root=args.dockerd_root)
    try:
        daemon.start()
        if daemon.attached:
            print(f"already running: export DOCKER_HOST={daemon.url}")
            return 0
        print(f"export DOCKER_HOST={daemon.url}   (Ctrl-C stops the engine)", flush=True)
        assert daemon.proc is not None  # started here, not attached
        daemon.proc.wait()
    except DockerUnavailable as e:
        print(f"sandbox dockerd: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal does not cut the stop short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        daemon.stop()
    return 0


def _engine(docker_host: str | None, dockerd_root: str | None):
    """(client, daemon-we-started or None)."""
    import docker

    from polar_pl.sandbox.dockerd import DockerDaemon

    if docker_host:
        return docker.DockerClient(base_url=docker_host, timeout=600), None
    daemon = DockerDaemon(root=dockerd_root or ".cache/dockerd").start()
    return docker.DockerClient(base_url=daemon.url, timeout=600), daemon


def _build(args: argparse.Namespace) -> int:
    from polar_pl.sandbox.dockerd import DockerUnavailable
    from polar_pl.sandbox.image import DEFAULT_TAG, build_image, pydeps_dir, rootfs_tarball

    t0 = time.monotonic()
    try:
        tarball = rootfs_tarball()
        print(f"rootfs: {tarball} ({tarball.stat().st_size / 2**20:.0f} MiB)")
        print(f"pydeps: {pydeps_dir()}")
        client, daemon = _engine(args.docker_host, args.dockerd_root)
    except (DockerUnavailable, RuntimeError, OSError) as e:
        print(f"sandbox build-image: {e}", file=sys.stderr)
        return 1
    try:
        tag = build_image(client, args.tag or DEFAULT_TAG, force=args.force)
        print(f"image: {tag} ({time.monotonic() - t0:.1f}s)")
    finally:
        client.close()
        if daemon is not None:
            daemon.stop()
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    from polar_pl.sandbox.dockerd import DockerUnavailable
    from polar_pl.sandbox.sweep import sweep

    client = daemon = None
    if args.docker_host or args.dockerd_root:
        try:
            client, daemon = _engine(args.docker_host, args.dockerd_root)
        except DockerUnavailable as e:
            print(f"docker: skipped ({e})", file=sys.stderr)
    try:
        report = sweep(args.owner, docker_client=client)
    finally:
        if client is not None:
            client.close()
        if daemon is not None:
            daemon.stop()
    print(f"local workspaces removed: {report.workspaces}")
    print(f"cgroups removed: {report.cgroups}")
    if client is not None:
        print(f"containers removed: {report.containers}")
    return 0
