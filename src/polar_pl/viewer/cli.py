"""`polar-pl view --store traces.db [--run DIR ...] [--port 8765]`: serve the viewer on 127.0.0.1.

polar-pl view --run outputs/2026-12-01/10-00-00        # a run directory (its traces.db)
polar-pl view --run outputs                            # every run below it
polar-pl view --store traces.db                        # a bare store: sessions by group
"""

from __future__ import annotations

import argparse
import os


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, help="trace store (default: each run's own traces.db)")
    p.add_argument(
        "--run", action="append", default=[], help="run directory, or a folder of runs (repeatable)"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument(
        "--tokenizer",
        default=os.environ.get("POLAR_TINY_MODEL"),
        help="model directory to decode tokens with when a run names none",
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from polar_pl.viewer.app import create_app

    try:
        app = create_app(args.store, args.run, tokenizer=args.tokenizer)
    except ValueError as exc:
        print(f"polar-pl view: {exc}")
        return 2
    print(f"polar_pl viewer on http://{args.host}:{args.port}/  (Ctrl-C stops it)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
