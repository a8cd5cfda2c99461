"""How the embedded engine should apply a pushed LoRA adapter: merged into its weights, or kept as
PEFT's LoRA layers (the choice made in src/polar_pl/engine/adapter.py).

    .venv/bin/python bench/lora_apply.py [--model DIR] [--rank 16] [--batch 8] [--steps 16] [--repeats 5]

On the real model (SmolLM2-135M-Instruct, float32, one torch thread, as the engine runs on CPU):
- merge: `AdapterMerge.apply` (W = W0 + scaling * B @ A for every targeted linear, from the base
  copy) per push, then decode steps of the plain model;
- layers: PEFT's LoRA layers in the model, `set_peft_model_state_dict` per push, then decode steps
  that run the extra A / B products in every targeted linear.
A decode step is one token for `--batch` sequences over a 64-token prompt's KV cache. Medians over
`--repeats` (interleaved, so a busy machine slows both alike). Ends with one summary line.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from polar_pl.engine.adapter import AdapterMerge
from polar_pl.module.lora import LoraSpec, adapter_state, attach
from polar_pl.module.model import load_model

ROOT = Path(__file__).resolve().parents[1]


def random_adapter(model_dir: Path, rank: int) -> tuple[dict[str, torch.Tensor], dict]:
    """An adapter as the trainer pushes it, with B drawn at random (a trained one is nonzero)."""
    peft_model = attach(load_model(model_dir), LoraSpec(rank=rank))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    return adapter_state(peft_model)


def decode_ms(model: torch.nn.Module, batch: int, steps: int) -> float:
    """Milliseconds per decode step of `batch` sequences after a 64-token prompt."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (batch, 64), generator=g)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    return (time.perf_counter() - t0) * 1000 / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=ROOT / ".cache/smollm2-135m-instruct")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from peft.utils import set_peft_model_state_dict

    tensors, config = random_adapter(args.model, args.rank)
    merged = load_model(args.model).eval()
    merge = AdapterMerge(merged)
    merge.apply(tensors, config)  # the first push also copies the base: not the steady state
    layered = attach(load_model(args.model), LoraSpec(rank=args.rank)).eval()
    times: dict[str, list[float]] = {k: [] for k in ("merge_s", "layers_s", "merge_ms", "layers_ms")}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        merge.apply(tensors, config)
        times["merge_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.no_grad():
            set_peft_model_state_dict(layered, tensors)
        times["layers_s"].append(time.perf_counter() - t0)
        times["merge_ms"].append(decode_ms(merged, args.batch, args.steps))
        times["layers_ms"].append(decode_ms(layered, args.batch, args.steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    table = Table(
        title=f"LoRA rank {args.rank} on {args.model.name}: apply a push, then decode ({args.batch} seqs)"
    )
    for col in ("how", "apply per push (s)", "decode step (ms)"):
        table.add_column(col)
    table.add_row("merged into the weights", f"{med['merge_s']:.3f}", f"{med['merge_ms']:.1f}")
    table.add_row("PEFT LoRA layers", f"{med['layers_s']:.3f}", f"{med['layers_ms']:.1f}")
    Console().print(table)
    slower = med["layers_ms"] / med["merge_ms"] - 1
    steps_to_pay = (med["merge_s"] - med["layers_s"]) / max((med["layers_ms"] - med["merge_ms"]) / 1000, 1e-9)
    print(f"summary: merge {med['merge_s']:.3f} s/push vs layers {med['layers_s']:.3f} s/push; decode "
          f"{med['merge_ms']:.1f} vs {med['layers_ms']:.1f} ms/step (layers {slower:+.0%}); merging pays "
          f"for itself after {steps_to_pay:.0f} decode steps per push")  # fmt: skip


if __name__ == "__main__":
    main()
