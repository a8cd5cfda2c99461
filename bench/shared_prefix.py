"""Shared-prefix (tree) training vs per-row training of one GRPO group, on the real model.

    .venv/bin/python bench/shared_prefix.py [--model DIR] [--prompts 2000,15000] [--group 8]
                                            [--sampled 200] [--per-row-sample N]

A group of `--group` rows that share a `--prompts`-token prompt (random tokens: what matters is
the length) and then have `--sampled` sampled tokens each (random, trainable, rewards 0/1
alternating). One GRPO update (one optimiser step, the gradient recorded, the weights left
alone) runs on the same module and rows laid out two ways:
- per row: collate mode "pack", one row per sequence (the prompt computed once per row);
- tree: collate mode "tree", the prompt once and the rows' suffixes on it (datamodule/tree.py).
Both run micro-batches of one sequence with gradient checkpointing (a 15 k-token row's
activations otherwise pass the machine's memory). Prints the update's wall time both ways, the
speedup, the tokens each computes, and the gradients' relative difference: over the whole
gradient and the largest over parameters. The last line: `shared prefix 15k: N.NNx, max rel grad diff
X` (the longest prompt's speedup; the whole gradient's difference at the longest prompt compared).

`--per-row-sample N` times N rows of the per-row path and scales by group / N (its rows are
independent sequences of equal length, so the time is linear in them) and skips the gradient
comparison: on a 2-core CPU the per-row update of 8 rows of 15 k tokens takes most of an hour.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from polar_pl.datamodule.collate import collate
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings
from polar_pl.trajectory.rows import TrajectoryRow

ROOT = Path(__file__).resolve().parents[1]


class Recorder(torch.optim.Optimizer):
    """Keeps the gradient of the step and leaves the weights alone."""

    def __init__(self, params):
        super().__init__(list(params), {"lr": 0.0})
        self.grads: list[torch.Tensor] = []

    def step(self, closure=None):
        ps = [p for g in self.param_groups for p in g["params"]]
        self.grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in ps]


def group(prompt: int, size: int, sampled: int, vocab: int, seed: int = 0) -> list[TrajectoryRow]:
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randint(1, vocab, (prompt,), generator=gen).tolist()
    rows = []
    for k in range(size):
        own = torch.randint(1, vocab, (sampled,), generator=gen).tolist()
        rows.append(
            TrajectoryRow(
                input_ids=shared + own, loss_mask=[0] * prompt + [1] * sampled,
                behavior_logprobs=[0.0] * prompt + [-1.2] * sampled, policy_version=[-1] * prompt + [0] * sampled,
                session_id=f"r{k}", rollout_id=f"r{k}", group_id="g", reward=float(k % 2), harness="mini",
                meta={"call_kind": "main", "calls": [{"start": prompt, "finish_reason": "stop", "sampling": {}}]},
            )
        )  # fmt: skip
    return rows


def timed_update(
    module: GRPOModule, rows: list[TrajectoryRow], mode: str
) -> tuple[float, list[torch.Tensor], int]:
    budget = max(len(r.input_ids) for r in rows) if mode == "pack" else None
    batch = collate(rows, mode=mode, token_budget=budget)
    module.model.zero_grad(set_to_none=True)
    opt = Recorder(module.model.parameters())
    t0 = time.perf_counter()
    module.update(batch, opt)
    return time.perf_counter() - t0, opt.grads, batch.total_tokens - batch.padding_tokens


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / ".cache/smollm2-135m-instruct"))
    ap.add_argument("--prompts", default="2000,15000")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--sampled", type=int, default=200)
    ap.add_argument("--per-row-sample", type=int, default=None)
    args = ap.parse_args()
    model_dir = Path(args.model)
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"no model at {model_dir}: `make real-model` builds it")
    module = GRPOModule(
        model_dir,
        settings=GRPOSettings(
            grad_clip=None, micro_batch_size=1, gradient_checkpointing=True, filter_zero_variance=False
        ),
    )
    vocab = module.model.config.vocab_size
    table = Table(title=f"one GRPO update of a group of {args.group} on {model_dir.name}")
    for col in (
        "prompt",
        "tokens per row / tree",
        "per row s",
        "tree s",
        "speedup",
        "grad rel (all / max param)",
    ):
        table.add_column(col, justify="right")
    speedups: dict[int, float] = {}
    grad_diffs: dict[int, float] = {}
    for mode in ("tree", "pack"):  # first-call costs (kernels, allocator) out of the timings
        timed_update(module, group(32, 2, 8, vocab), mode)
    for prompt in (int(p) for p in args.prompts.split(",")):
        rows = group(prompt, args.group, args.sampled, vocab)
        tree_s, tree_grads, tree_tokens = timed_update(module, rows, "tree")
        n = args.per_row_sample or args.group
        row_s, row_grads, row_tokens = timed_update(module, rows[:n], "pack")
        row_s, row_tokens = row_s * args.group / n, row_tokens * args.group // n
        if n == args.group:
            flat = [torch.cat([g.flatten() for g in gs]) for gs in (tree_grads, row_grads)]
            worst = max(rel(a, b) for a, b in zip(tree_grads, row_grads, strict=True) if float(b.norm()) > 0)
            grad_diffs[prompt] = rel(*flat)
            grad = f"{grad_diffs[prompt]:.1e} / {worst:.1e}"
        else:
            grad = f"not compared ({n} of {args.group} rows timed)"
        table.add_row(str(prompt), f"{row_tokens} / {tree_tokens}", f"{row_s:.1f}", f"{tree_s:.1f}",
                      f"{row_s / tree_s:.2f}x", grad)  # fmt: skip
        speedups[prompt] = row_s / tree_s
        print(f"{prompt}-token prompt: per row {row_s:.1f} s, tree {tree_s:.1f} s", flush=True)
    Console().print(table)
    longest = max(speedups)
    if grad_diffs:
        at = max(grad_diffs)
        diff = f"{grad_diffs[at]:.1e}" + (
            "" if at == longest else f" (at {at} tokens; {longest} not compared)"
        )
    else:
        diff = "not compared"
    print(f"shared prefix {longest / 1000:g}k: {speedups[longest]:.2f}x, max rel grad diff {diff}")


if __name__ == "__main__":
    main()
