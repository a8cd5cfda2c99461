"""Peak trainer memory of one GRPO update on the tiny model, by row length: bounded (chunked
LM head / log-softmax / entropy, activation checkpointing, micro-batches by tokens) against the
unbounded baseline (whole-sequence logits, no checkpointing); "chunked" is the LM-head chunking
alone. conf/module/grpo.yaml's defaults are the bounded mode.

Each measurement runs `GRPOModule.update` in a fresh child process on one group of two rollouts:
a row of L tokens (a quarter prompt, the rest sampled, reward 1) and a short row (reward 0).
Peak RSS is the child's `ru_maxrss` (the whole process: Python, torch, model, optimizer state);
"before" is its RSS with the model and the batch built, before the update.

    python bench/train_memory.py                          # 2k, 8k, 16k, 32k; baseline up to 16k
    python bench/train_memory.py --lengths 2048,8192 --baseline-max 8192
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MODES = {
    "bounded": {"logprob_chunk_tokens": 1024, "gradient_checkpointing": True, "micro_batch_tokens": 32768},
    "chunked": {"logprob_chunk_tokens": 1024, "gradient_checkpointing": False, "micro_batch_tokens": 32768},
    "baseline": {"logprob_chunk_tokens": None, "gradient_checkpointing": False, "micro_batch_tokens": None},
}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(length: int, mode: str, model_dir: str) -> dict:
    import torch

    from polar_pl.datamodule.collate import collate
    from polar_pl.module.grpo import GRPOModule
    from polar_pl.module.settings import GRPOSettings
    from polar_pl.trajectory.rows import TrajectoryRow

    torch.manual_seed(0)
    module = GRPOModule(model_dir, settings=GRPOSettings(lr=1e-4, **MODES[mode]))
    vocab = module.model.config.vocab_size

    def row(n: int, rollout: str, reward: float) -> TrajectoryRow:
        p = n // 4
        return TrajectoryRow(
            input_ids=torch.randint(0, vocab, (n,)).tolist(),
            loss_mask=[0] * p + [1] * (n - p),
            behavior_logprobs=[0.0] * p + [-9.0] * (n - p),
            policy_version=[-1] * p + [0] * (n - p),
            session_id=rollout, rollout_id=rollout, group_id="g", reward=reward,
        )  # fmt: skip

    batch = collate([row(length, "long", 1.0), row(256, "short", 0.0)], token_budget=length)
    opt = module.configure_optimizers()
    before = _rss_mb()
    t0 = time.perf_counter()
    metrics = module.update(batch, opt)
    return {
        "length": length,
        "mode": mode,
        "before_mb": before,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "update_s": time.perf_counter() - t0,
        "optimizer_steps": metrics["train/optimizer_steps"],
    }


def measure(length: int, mode: str, model_dir: str) -> dict:
    cmd = [sys.executable, __file__, "--child", str(length), mode, "--model-dir", model_dir]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {
            "length": length,
            "mode": mode,
            "error": out.stderr.strip().splitlines()[-1:] or [str(out.returncode)],
        }
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="2048,8192,16384,32768")
    ap.add_argument("--modes", default="bounded,baseline", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument(
        "--baseline-max", type=int, default=16384, help="longest row the other modes run (memory grows fast)"
    )
    default_model = os.environ.get(
        "POLAR_TINY_MODEL", str(Path(__file__).resolve().parents[1] / ".cache" / "tiny-model")
    )
    ap.add_argument("--model-dir", default=default_model)
    ap.add_argument("--child", nargs=2, metavar=("LENGTH", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1], args.model_dir)))
        return
    print(f"{'row tokens':>10} {'mode':>9} {'before MB':>10} {'peak MB':>9} {'update s':>9}")
    for length in (int(x) for x in args.lengths.split(",")):
        for mode in args.modes.split(","):
            if mode != "bounded" and length > args.baseline_max:
                continue
            r = measure(length, mode, args.model_dir)
            if "error" in r:
                print(f"{length:>10} {mode:>9} failed: {r['error']}")
                continue
            print(
                f"{length:>10} {mode:>9} {r['before_mb']:>10.0f} {r['peak_mb']:>9.0f} {r['update_s']:>9.1f}"
            )


if __name__ == "__main__":
    main()
