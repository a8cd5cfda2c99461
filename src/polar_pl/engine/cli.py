"""`polar-pl engine`: serve the embedded engine (transformers, CPU or GPU) over HTTP."""

from __future__ import annotations

import argparse

from polar_pl.utils import metrics, tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="HF model directory (config.json, safetensors, tokenizer)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--served-model-name", default=None, help="model name requests use (default: --model)"
    )
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="float32 / bfloat16 / auto (default: float32 on CPU)")
    parser.add_argument("--max-batch-size", type=int, default=64, help="sequences stepped together")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: half the cores, <= 8)"
    )
    parser.add_argument(
        "--reasoning-parser", default=None, choices=["qwen3"], help="split <think> output into `reasoning`"
    )
    parser.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=512,
        help="KV of recent prompts reused by prompts that extend them (0: off)",
    )
    parser.add_argument(
        "--no-fast-decoder",
        dest="fast_decoder",
        action="store_false",
        help="run transformers' forward instead of the engine's own (Llama / Mistral / Qwen2 / Qwen3 "
        "in float32 on the CPU; it keeps a packed copy of the linear weights)",
    )
    tokens.add_arguments(
        parser,
        "file holding the bearer token for POST /update_weights_from_disk "
        "(default: $POLAR_ADMIN_TOKEN; neither: weight updates are off)",
    )
    metrics.add_arguments(parser)
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import uvicorn

    from polar_pl.engine.server import create_app
    from polar_pl.engine.transformers_backend import TransformersBackend, default_threads

    if not (Path(args.model) / "config.json").exists():
        print(f"polar-pl engine: no config.json in {args.model}")
        return 2
    try:
        token = tokens.admin_token(args.admin_token_file)
    except (OSError, ValueError) as exc:
        print(f"polar-pl engine: {exc}")
        return 2
    if token is None:
        print(
            "polar-pl engine: no admin token (--admin-token-file, $POLAR_ADMIN_TOKEN): weight updates are off"
        )
    backend = TransformersBackend(
        args.model,
        model_name=args.served_model_name or args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_batch_size=args.max_batch_size,
        num_threads=args.threads or default_threads(),
        prefix_cache_mb=args.prefix_cache_mb,
        fast_decoder=args.fast_decoder,
    )
    uvicorn.run(
        create_app(
            backend,
            reasoning_parser=args.reasoning_parser,
            admin_token=token,
            metrics_token=args.metrics_token,
        ),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
    )
    return 0
