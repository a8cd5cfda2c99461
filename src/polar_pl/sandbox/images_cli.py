"""`polar-pl sandbox images` and `polar-pl sandbox gc`: per-task images ahead of a run, and after.

    polar-pl sandbox images --tasks DIR|FILE.jsonl ... [--docker-host URL ...] [--registry R]
    polar-pl sandbox gc --tasks DIR|FILE.jsonl ... [--docker-host URL ...] [--dry-run]

`--tasks` takes Harbor task folders (a task or a folder of tasks) and SWE-bench-format JSONL /
parquet files; `images` makes every image they name present on every host (found, pulled or built,
as INIT would) and prints a table with sizes; `gc` removes per-task images (ones this tool built,
and `polar-pl/harbor-*` / `sweb.eval.*` ones) that none of the given task sets needs, and tools
volumes no container uses. The base image is always kept.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_arguments(sub) -> None:
    for name, help_text in (
        ("images", "pull / build the images of task sets on every host; report sizes"),
        ("gc", "remove per-task images no given task set needs"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "--tasks", nargs="+", required=True, help="Harbor task folders and/or SWE-bench JSONL files"
        )
        p.add_argument("--docker-host", action="append", help="engine URL (repeatable; default DOCKER_HOST)")
        p.add_argument(
            "--cert-path", help="TLS client certificates (ca.pem, cert.pem, key.pem) for tcp:// hosts"
        )
        if name == "images":
            p.add_argument("--registry", default=None, help="registry to pull from")
            p.add_argument("--docker-config", default=None, help="Docker config.json with credentials")
            p.add_argument("--max-pulls", type=int, default=2)
        else:
            p.add_argument("--dry-run", action="store_true", help="list what would be removed")


def task_images(specs: list[str]) -> dict[str, str | None]:
    """{image: build context or None} over the task sets named by `specs`."""
    from polar_pl.tasks.sources import HarborTaskSource, SWEBenchTaskSource

    out: dict[str, str | None] = {}
    for spec in specs:
        path = Path(spec)
        source = HarborTaskSource(spec) if path.is_dir() else SWEBenchTaskSource(spec)
        for t in source.tasks():
            if t.image:
                out[t.image] = out.get(t.image) or t.image_context
    return out


def _pool(args: argparse.Namespace, **images):
    from polar_pl.sandbox.docker import default_host
    from polar_pl.sandbox.hosts import HostPool

    urls = args.docker_host or [default_host()]
    hosts = [
        {"url": u, "cert_path": args.cert_path} if args.cert_path and u.startswith("tcp") else u for u in urls
    ]
    return HostPool(hosts, images=images)


def images(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from polar_pl.sandbox.images import image_size
    from polar_pl.sandbox.infra import InfraError

    wanted = task_images(args.tasks)
    pool = _pool(args, registry=args.registry, docker_config=args.docker_config, max_pulls=args.max_pulls)
    table = Table(title=f"{len(wanted)} images on {len(pool.hosts)} host(s)")
    for col in ("host", "image", "how", "MiB", "s"):
        table.add_column(col)
    failed = 0
    t0 = time.monotonic()
    try:
        futures = [
            (h, name, h.images.prefetch(name, ctx)) for h in pool.hosts for name, ctx in wanted.items()
        ]
        for host, name, fut in futures:
            try:
                event = fut.result()
            except InfraError as exc:
                failed += 1
                table.add_row(host.url, name, f"[red]failed[/red]: {exc}"[:120], "-", "-")
                continue
            client = host.client()
            size = image_size(client, name) / 2**20
            client.close()
            table.add_row(host.url, name, event.how, f"{size:.0f}", f"{event.seconds:.1f}")
    finally:
        pool.close()
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    print(f"{len(futures) - failed}/{len(futures)} present in {time.monotonic() - t0:.1f}s")
    return 1 if failed else 0


def gc(args: argparse.Namespace) -> int:
    import docker

    from polar_pl.sandbox.docker_remote import TOOLS_LABEL
    from polar_pl.sandbox.image import DEFAULT_TAG
    from polar_pl.sandbox.images import IMAGE_LABEL, TASK_IMAGE_PATTERNS

    keep = set(task_images(args.tasks)) | {DEFAULT_TAG}
    pool = _pool(args)
    removed = 0
    for host in pool.hosts:
        client = host.client()
        try:
            for image in client.images.list():
                tags = image.tags or []
                ours = image.labels.get(IMAGE_LABEL) == "1" or any(
                    p in t for t in tags for p in TASK_IMAGE_PATTERNS
                )
                if not ours or any(t in keep for t in tags):
                    continue
                print(
                    f"{host.url}: {'would remove' if args.dry_run else 'removing'} {', '.join(tags) or image.id}"
                )
                if not args.dry_run:
                    client.images.remove(image.id, force=True)
                removed += 1
            for volume in client.volumes.list(filters={"label": f"{TOOLS_LABEL}=1", "dangling": True}):
                print(f"{host.url}: {'would remove' if args.dry_run else 'removing'} volume {volume.name}")
                if not args.dry_run:
                    try:
                        volume.remove()
                    except docker.errors.APIError as exc:  # in use by a container made meanwhile
                        print(f"  kept: {exc}", file=sys.stderr)
                        continue
                removed += 1
        finally:
            client.close()
    pool.close()
    print(f"{removed} {'to remove' if args.dry_run else 'removed'}; kept {len(keep)} needed images")
    return 0
