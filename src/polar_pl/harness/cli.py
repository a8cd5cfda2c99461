"""`polar-pl harness install NAME|all [--prefix DIR]`: install the pinned harness CLIs from npm.

Idempotent: a harness whose pinned version is already under the prefix is skipped without
touching npm, so `make test` can call it every time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from polar_pl.harness import HARNESSES, build_harness

DEFAULT_PREFIX = os.environ.get("POLAR_HARNESS_PREFIX", ".cache/harness")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    inst = sub.add_parser("install", help="install pinned harness CLIs (npm) under a prefix")
    inst.add_argument("name", help=f"one of {', '.join(HARNESSES)} or 'all'")
    inst.add_argument("--prefix", default=DEFAULT_PREFIX, help="install root (default: %(default)s)")
    sub.add_parser("list", help="list harnesses with pinned versions and providers")


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for name in HARNESSES:
            h = build_harness(name)
            providers = getattr(h, "providers", ("openai_chat",))
            print(f"{name:12s} {h.version:10s} default={h.provider:17s} providers={','.join(providers)}")
        return 0
    names = list(HARNESSES) if args.name == "all" else [args.name]
    if args.name != "all" and args.name not in HARNESSES:
        print(
            f"harness install: unknown harness {args.name!r}; allowed: {', '.join(HARNESSES)}, all",
            file=sys.stderr,
        )
        return 2
    prefix = Path(args.prefix).resolve()
    prefix.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        h = build_harness(name)
        if h.is_installed(prefix):
            getattr(h, "post_install", lambda prefix: None)(prefix)
            print(f"{name}: {h.version} already installed")
            continue
        if args.name == "all" and shutil.which("npm") is None:
            # `install all` on a machine without Node: the Node CLIs cannot run there anyway, and
            # `mini` (the default harness) needs nothing. A named install still fails loudly.
            print(f"{name}: skipped, npm (Node.js) is not installed", file=sys.stderr)
            continue
        print(f"{name}: installing {h.version} into {prefix}", flush=True)
        try:
            h.install(prefix)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as e:  # report, go on with the rest
            print(f"{name}: install failed: {e}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0
