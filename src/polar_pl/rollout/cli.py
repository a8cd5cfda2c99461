"""`polar-pl rollout serve [--feed config|queue] [--port P] [hydra overrides ...]`: polar_pl's
rollouts (engine, gateways, harnesses in sandboxes, evaluators) as an HTTP service for a trainer
that is not ours. The overrides are the training config's (`rollout=ray harness=pi task=builtin`).
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from pathlib import Path

from polar_pl.utils import metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    serve = sub.add_parser("serve", help="serve rollouts over HTTP (OpenAPI at /openapi.json)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument("--token", default=os.environ.get("POLAR_ROLLOUT_TOKEN"),
                       help="bearer token clients must send (default: $POLAR_ROLLOUT_TOKEN, else generated)")  # fmt: skip
    serve.add_argument("--feed", choices=("config", "queue"), default="config",
                       help="config: groups from the configured task source; queue: only POST /v1/tasks")  # fmt: skip
    serve.add_argument("--max-streams", type=int, default=64,
                       help="GET /v1/groups/stream connections open at once; one more gets a 429")  # fmt: skip
    metrics.add_arguments(serve)
    serve.add_argument("--run-dir", default=None, help="traces and logs (default: outputs/rollout-<time>)")
    serve.add_argument("overrides", nargs="*", help="training-config overrides, e.g. rollout=ray harness=pi")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from polar_pl.rollout.build import build_runtime
    from polar_pl.rollout.http.app import create_app
    from polar_pl.rollout.http.server import RolloutServer, compose_config, feed_tasks

    run_dir = Path(args.run_dir or f"outputs/rollout-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    runtime = build_runtime(compose_config(args.overrides, run_dir), tasks=feed_tasks(args.feed))
    token = args.token or secrets.token_urlsafe(24)
    server = RolloutServer(runtime).start()
    try:
        shown = token if not args.token else "(the one you gave)"
        print(f"rollout service at http://{args.host}:{args.port} feed={args.feed} token={shown}", flush=True)
        app = create_app(server, token=token, max_streams=args.max_streams, metrics_token=args.metrics_token)
        # open streams never end by themselves: a stop cancels them (their groups go back) after 5 s
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        server.stop()  # rollouts, engine, evaluator, sandbox hosts
    return 0
