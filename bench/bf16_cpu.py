"""bf16 autocast against fp32 on this CPU: SmolLM2-135M-Instruct's forward and backward, side by side.

The real-model experiments train under bf16 autocast only where the CPU computes bf16 natively
(`${cpu_bf16:bf16-mixed,32-true}`, src/polar_pl/utils/cpu.py). This bench shows why, on the machine
it runs on: it alternates fp32 and bf16 steps on the same batch and prints each median and their
ratio. Measured: a 2-core AMD EPYC (AVX2 only) 3.4-3.9 s fp32 against 108-112 s bf16 (~30x slower);
a CPU with AVX-512 BF16, ~1.8x faster under bf16 (docs/real-model.md).

    make real-model && .venv/bin/python bench/bf16_cpu.py [--batch 4 --tokens 128 --repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from polar_pl.utils.cpu import bf16_is_native


def step(model, ids: torch.Tensor, bf16: bool) -> float:
    t0 = time.monotonic()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=ids).logits.float().mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(Path(".cache/smollm2-135m-instruct")))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.tokens))
    step(model, ids, False)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for bf16 in (False, True):
            times[bf16].append(step(model, ids, bf16))
    fp32, bf16 = statistics.median(times[False]), statistics.median(times[True])
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: {bf16_is_native()}")
    print(f"fp32 {fp32:.2f} s, bf16 autocast {bf16:.2f} s a step: bf16/fp32 = {bf16 / fp32:.2f}")


if __name__ == "__main__":
    main()
