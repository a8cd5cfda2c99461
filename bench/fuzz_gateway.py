"""Malformed input against the gateway: ~2,500 requests per pass across the four provider APIs,
each pass with and without a max_tokens cap (the kit and what it measures: polar_pl.testing.fuzz).

    python bench/fuzz_gateway.py                     # chat and token-faithful mode, cap none and 64
    python bench/fuzz_gateway.py --requests 500 --modes chat --caps 64 --seed 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from polar_pl.testing.fuzz import failures, run_pass
from polar_pl.testing.scripted import default_model_dir


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=2500)
    p.add_argument("--modes", default="chat,faithful")
    p.add_argument("--caps", default="none,64", help="max_tokens caps, comma-separated ('none': no cap)")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--model-dir", default=None)
    args = p.parse_args()
    model_dir = Path(args.model_dir) if args.model_dir else default_model_dir()
    caps = [None if c == "none" else int(c) for c in args.caps.split(",")]
    bad = 0
    with tempfile.TemporaryDirectory(prefix="polar-fuzz-") as tmp:
        for mode in args.modes.split(","):
            for cap in caps:
                result = run_pass(mode, args.requests, args.seed, args.concurrency, model_dir, Path(tmp), cap)
                print(json.dumps(result, indent=1), flush=True)
                bad += failures(result)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
