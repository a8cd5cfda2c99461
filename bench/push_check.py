"""What checking a weight push whole costs, next to the copy it guards (engine/weights.py
`check_tensors`: names, shapes, floating point, finite values, before any weight changes).

    .venv/bin/python bench/push_check.py [--repeats 5] [--threads 1]

A state dict of SmolLM2-135M's shapes (134.5M float32 values, random: no model is read), checked
against its specs and copied into a second one, as the embedded engine does on a push. Medians
over `--repeats`, interleaved (a busy machine slows both alike). Ends with one summary line.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from polar_pl.engine.weights import TensorSpec, check_tensors


def smollm2_shapes() -> dict[str, tuple[int, ...]]:
    hidden, inter, kv, vocab = 576, 1536, 192, 49152
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    for layer in range(30):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }  # fmt: skip
    return shapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = smollm2_shapes()
    state = {k: torch.randn(s) for k, s in shapes.items()}
    target = {k: torch.empty(s) for k, s in shapes.items()}
    specs = {k: TensorSpec(s) for k, s in shapes.items()}
    check, copy = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        check_tensors(state, specs)
        check.append(time.perf_counter() - t)
        t = time.perf_counter()
        for k, v in state.items():
            target[k].copy_(v)
        copy.append(time.perf_counter() - t)
    n = sum(v.numel() for v in state.values()) / 1e6
    c, p = statistics.median(check) * 1e3, statistics.median(copy) * 1e3
    print(f"push check: {n:.1f}M float32 values, {args.threads} thread(s): check {c:.0f} ms, copy {p:.0f} ms")


if __name__ == "__main__":
    main()
