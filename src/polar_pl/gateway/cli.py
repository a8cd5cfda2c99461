"""`polar-pl gateway`: run the gateway standalone in front of one or more engines."""

from __future__ import annotations

import argparse
import os
import secrets
import sys

from polar_pl.gateway.call.sidecalls import SideCallRule


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream",
        action="append",
        required=True,
        metavar="URL",
        help="engine base URL (repeat for several replicas)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8787)
    p.add_argument("--store", required=True, metavar="PATH", help="trace store (SQLite file)")
    p.add_argument(
        "--admin-token",
        default=None,
        help="admin bearer token (default: $POLAR_ADMIN_TOKEN, else generated and printed)",
    )
    p.add_argument(
        "--tokenizer-dir",
        default=None,
        help="model dir of the served model, for count_tokens and token-faithful prompts "
        "(default: ask the engine; token-faithful off)",
    )
    p.add_argument(
        "--token-faithful",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="splice sampled tokens into prompts and call the engine's token-in route "
        "(default: on with --tokenizer-dir)",
    )
    p.add_argument(
        "--reasoning-parser",
        default=None,
        help="the engine's reasoning parser (vLLM --reasoning-parser, e.g. qwen3), for token-in answers",
    )
    p.add_argument(
        "--max-tokens-cap", type=int, default=None, help="upper bound on each call's response tokens"
    )
    p.add_argument(
        "--pause-timeout",
        type=float,
        default=300.0,
        help="seconds a call waits while paused (POST /admin/pause) before a retryable 503/529",
    )
    p.add_argument("--model", default=None, help="served model name (default: the engine's /v1/models)")
    p.add_argument("--public-url", default=None, help="URL harnesses use to reach this gateway")
    p.add_argument("--client", choices=("aiohttp", "httpx"), default="aiohttp", help="upstream HTTP client")
    p.add_argument(
        "--store-sync",
        default="NORMAL",
        choices=("OFF", "NORMAL", "FULL", "EXTRA"),
        help="SQLite synchronous level: NORMAL (default) survives a gateway crash, "
        "FULL also power loss (one fsync per group commit)",
    )
    p.add_argument(
        "--side-rules",
        default=None,
        metavar="JSON",
        help="JSON file with a list of side-call rules replacing the defaults",
    )
    p.add_argument("--read-timeout", type=float, default=600.0, help="seconds to wait for each engine chunk")
    p.add_argument("--log-level", default="warning")


def run(args: argparse.Namespace) -> int:
    import orjson
    import uvicorn

    from polar_pl.gateway.http.app import create_app

    token = args.admin_token or os.environ.get("POLAR_ADMIN_TOKEN")
    generated = token is None
    token = token or secrets.token_urlsafe(24)
    side_rules = None
    if args.side_rules:
        with open(args.side_rules, "rb") as f:
            side_rules = tuple(SideCallRule.from_dict(d) for d in orjson.loads(f.read()))
    public = args.public_url or f"http://{args.host}:{args.port}"
    app = create_app(
        args.upstream,
        args.store,
        admin_token=token,
        tokenizer_dir=args.tokenizer_dir,
        model=args.model,
        side_rules=side_rules,
        client=args.client,
        store_synchronous=args.store_sync,
        public_url=public,
        read_timeout=args.read_timeout,
        token_faithful=args.token_faithful,
        reasoning_parser=args.reasoning_parser,
        max_tokens_cap=args.max_tokens_cap,
        pause_timeout=args.pause_timeout,
    )
    print(f"polar-pl gateway on {public} -> {', '.join(args.upstream)} (store {args.store})", flush=True)
    if generated:
        print(f"admin token: {token}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=60)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="polar-pl gateway")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
