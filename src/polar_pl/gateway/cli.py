"""`polar-pl gateway`: run the gateway standalone in front of one or more engines."""

from __future__ import annotations

import argparse
import os
import sys

from polar_pl.gateway.call.sidecalls import SideCallRule
from polar_pl.utils import metrics, tokens


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
    tokens.add_arguments(
        p,
        "file holding the admin bearer token (default: $POLAR_ADMIN_TOKEN; neither: a new token is "
        "written to <store>.admin-token, readable by you only). A missing file is created the same way",
    )
    p.add_argument(
        "--tokenizer-dir",
        default=None,
        help="model dir of the served model, for count_tokens and token-faithful prompts "
        "(default: the directory the engine reports serving in GET /v1/models, if it is on this machine)",
    )
    p.add_argument(
        "--token-faithful",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="splice sampled tokens into prompts and call the engine's token-in route (default: on; "
        "needs the tokenizer; --no-token-faithful re-renders every prompt, so prefix merging breaks "
        "wherever the template renders an echoed turn differently)",
    )
    p.add_argument(
        "--token-faithful-check",
        action="store_true",
        help="also build every incremental token-faithful prompt by a full render and compare them "
        "(a full render per call; keeps each prompt's plain re-render for drift diagnostics)",
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
        "--sampling",
        choices=("recorded", "pinned"),
        default="recorded",
        help="recorded: each call states the harness's temperature/top_p/top_k (the trainer rebuilds "
        "that distribution); pinned: temperature 1 (or --pinned-temperature), top_p 1, no top_k",
    )
    p.add_argument(
        "--pinned-temperature", type=float, default=1.0, help="the temperature of --sampling pinned"
    )
    p.add_argument(
        "--cap-policy",
        choices=("length", "end_turn"),
        default="length",
        help="what a harness is told when --max-tokens-cap cut its response: the truth (length) or "
        "a normal end of turn (end_turn: for CLIs that exit on a length stop); the record keeps the truth",
    )
    p.add_argument(
        "--pause-timeout",
        type=float,
        default=300.0,
        help="seconds a call waits while paused (POST /admin/pause) before a retryable 503/529",
    )
    p.add_argument(
        "--max-body-mb",
        type=float,
        default=32.0,
        help="largest request body, in MiB (checked while reading; past it: 413 in the provider's shape)",
    )
    p.add_argument(
        "--max-json-depth",
        type=int,
        default=128,
        help="deepest JSON nesting a request may have (past it: 400; the gateway's own JSON adds levels)",
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
    metrics.add_arguments(p)
    p.add_argument("--log-level", default="warning")


def engine_tokenizer_dir(upstream: str, timeout: float = 30.0) -> str | None:
    """The model directory the engine serves (vLLM's and the embedded engine's /v1/models `root`),
    if it is a tokenizer directory on this machine."""
    import time
    from pathlib import Path

    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            cards = httpx.get(f"{upstream.rstrip('/')}/v1/models", timeout=5).json().get("data") or []
            break
        except (httpx.HTTPError, ValueError):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)
    for card in cards:
        root = Path(str(card.get("root") or ""))
        if root.is_absolute() and (root / "tokenizer_config.json").exists():
            return str(root)
    return None


def run(args: argparse.Namespace) -> int:
    import orjson
    import uvicorn

    from polar_pl.gateway.http.app import create_app
    from polar_pl.utils.serving import Server

    if args.token_faithful and args.tokenizer_dir is None:
        args.tokenizer_dir = engine_tokenizer_dir(args.upstream[0])
        if args.tokenizer_dir is None:
            print(
                "polar-pl gateway: token-faithful prompts need the served model's tokenizer, and the "
                f"engine at {args.upstream[0]} does not report a model directory on this machine: pass "
                "--tokenizer-dir DIR (the engine's model directory) or --no-token-faithful",
                file=sys.stderr,
            )
            return 2

    path = args.admin_token_file
    if path is None and tokens.admin_token(None) is None:
        path = f"{os.path.splitext(args.store)[0]}.admin-token"
    try:
        token = tokens.admin_token(path, create=True)
    except (OSError, ValueError) as exc:
        print(f"polar-pl gateway: {exc}", file=sys.stderr)
        return 2
    side_rules = None
    if args.side_rules:
        with open(args.side_rules, "rb") as f:
            side_rules = tuple(SideCallRule.from_dict(d) for d in orjson.loads(f.read()))
    public = args.public_url or f"http://{args.host}:{args.port}"
    try:
        app = create_app(
            args.upstream,
            args.store,
            admin_token=token,
            metrics_token=args.metrics_token,
            tokenizer_dir=args.tokenizer_dir,
            model=args.model,
            side_rules=side_rules,
            client=args.client,
            store_synchronous=args.store_sync,
            public_url=public,
            read_timeout=args.read_timeout,
            token_faithful=args.token_faithful,
            token_faithful_check=args.token_faithful_check,
            reasoning_parser=args.reasoning_parser,
            max_tokens_cap=args.max_tokens_cap,
            sampling=args.sampling,
            pinned_temperature=args.pinned_temperature,
            cap_policy=args.cap_policy,
            pause_timeout=args.pause_timeout,
            max_body_bytes=int(args.max_body_mb * 2**20),
            max_json_depth=args.max_json_depth,
        )
    except ValueError as exc:  # a bad option value, named
        print(f"polar-pl gateway: {exc}", file=sys.stderr)
        return 2
    faithful = (
        f"token-faithful on (tokenizer {args.tokenizer_dir})" if args.token_faithful else "token-faithful off"
    )
    print(
        f"polar-pl gateway on {public} -> {', '.join(args.upstream)} (store {args.store}; {faithful})",
        flush=True,
    )
    if path is not None:
        print(f"admin token in {path}", flush=True)
    _tune_gc()
    # SIGTERM / Ctrl-C: the calls in flight are aborted upstream and recorded at once (Server's
    # hook), so what uvicorn then waits for is short; 3 s bounds a client slow to take its answer.
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=3
    )
    Server(config, on_shutdown=app.harness.stop).run()
    return 0


def _tune_gc() -> None:
    """The cyclic GC took ~0.3 ms of the ~1.4 ms of CPU a streamed request cost (bench/gateway.py,
    64 sessions: 384 collections in 6 s): every request allocates hundreds of dicts that live as
    long as it does, and each collection walked the ~77k objects of the imported modules. Those
    are frozen (never walked again) and young collections run every 20k allocations, not 700:
    what a request leaves in cycles is still collected, a little later."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="polar-pl gateway")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
