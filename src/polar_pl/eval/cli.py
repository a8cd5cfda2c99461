"""`polar-pl eval [group=option ...] [eval.key=value ...]`: the Hydra app of `python -m
polar_pl.eval` (conf/eval.yaml), and `polar-pl eval --compare A B` for two finished evaluations."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        default=None,
        help="two evaluation output directories: the paired difference of pass@1 (B - A)",
    )
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="Hydra overrides (conf/eval.yaml)")


def run(args: argparse.Namespace) -> int:
    if args.compare:
        from polar_pl.eval.report import compare, load_report

        try:
            a, b = (load_report(Path(d)) for d in args.compare)
        except FileNotFoundError as exc:
            print(
                f"polar-pl eval --compare: {exc.filename} is missing (not a finished evaluation)",
                file=sys.stderr,
            )
            return 2
        print(compare(a, b).table())
        return 0
    from polar_pl.eval.__main__ import main

    sys.argv = ["polar-pl eval", *args.overrides]
    main()
    return 0
