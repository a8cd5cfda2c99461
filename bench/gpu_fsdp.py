"""A few GRPO steps under `trainer.strategy=fsdp`: step time, MFU, weight-push seconds and the fresh
logprob gap, on GPUs (or a CPU dry run of the same code).

Each step, rank 0's engine (polar_pl's transformers engine, in-process: the code behind `polar-pl
engine`, without its HTTP server) samples `--groups` groups of `--group-size` completions of random
prompts from the policy as it is now; every rank receives the rows; `GRPOModule.update` trains one
optimiser step on them (each rank its share of the micro-batches, FSDP-sharded weights, gradients
and AdamW state, activation checkpointing per decoder layer) and pushes the new weights from the
shards (DiskSync: safetensors written as they are gathered, then the engine reloads them). The rows
of a step were sampled after the previous push, so `train/logprob_gap_mean` is the fresh gap:
|trainer - engine| logprob of the sampled tokens, the numerics alone (bf16 engine vs the trainer's
bf16 autocast over fp32 master weights on a GPU).

Models: `--model DIR` (an HF folder), or `--shape qwen3-1.7b | qwen3-4b | tiny`: Qwen3's shapes with
random weights and Qwen's own tokenizer (built offline, nothing is downloaded), written to --work.
MFU: the update's model FLOPs (the training forward and its backward at twice a forward:
3 x (2 N tokens + causal attention), N the matmul parameters with the LM head; the recomputation of
activation checkpointing not counted) per second, over the ranks' dense bf16 peak. The first step
warms up (kernels, allocator, AdamW state) and is left out of the means.

    python bench/gpu_fsdp.py --shape qwen3-1.7b                  # one H100 / H200, ~3 min
    python bench/gpu_fsdp.py --shape qwen3-4b --devices 8        # a node: 4 B sharded 8 ways
    python bench/gpu_fsdp.py --device cpu --model .cache/tiny-model --devices 2 --steps 2   # CPU dry run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from polar_pl.datamodule.collate import collate
from polar_pl.engine.backend import GenerationRequest, SamplingParams
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.sharding import FSDPStrategy
from polar_pl.module.weight_sync import DiskSync
from polar_pl.trajectory.rows import TrajectoryRow

sys.path.insert(0, str(Path(__file__).parent))
from gpu_step import PEAK_TFLOPS, QWEN3, matmul_params  # the one-GPU bench's shapes and peaks
from gpu_step import SHAPES as _SHAPES

SHAPES = {**_SHAPES, "qwen3-1.7b": QWEN3 | {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                                           "num_attention_heads": 16, "num_key_value_heads": 8}}  # fmt: skip


class LocalEngine:
    """The in-process engine as a push target: what the HTTP engine's weight routes call."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def update_weights_from_disk(self, path: str) -> int:
        return int(self.backend.update_weights_from_disk(path))

    def policy_version(self) -> int:
        return int(self.backend.policy_version) if self.backend is not None else 0


def sample(backend: Any, args: argparse.Namespace, step: int) -> list[TrajectoryRow]:
    """groups x group_size completions of random prompts at temperature 1, as trajectory rows (the
    prompt masked, the sampled tokens with the engine's logprobs and version); rewards alternate."""
    g = torch.Generator().manual_seed(step)
    vocab = min(len(backend.tokenizer), backend.model.config.vocab_size)
    rows = []
    for gi in range(args.groups):
        prompt = torch.randint(10, vocab, (args.prompt_len,), generator=g).tolist()
        params = SamplingParams(max_tokens=args.max_tokens, n=args.group_size, logprobs=0, ignore_eos=True,
                                seed=step * 1000 + gi)  # fmt: skip
        request = GenerationRequest(request_id=f"s{step}g{gi}", prompt_ids=tuple(prompt), params=params)
        for i, (ids, lps, version) in enumerate(asyncio.run(_collect(backend, request))):
            p = len(prompt)
            rows.append(TrajectoryRow(
                input_ids=prompt + ids, loss_mask=[0] * p + [1] * len(ids),
                behavior_logprobs=[0.0] * p + lps, policy_version=[-1] * p + [version] * len(ids),
                session_id=f"s{step}g{gi}-{i}", rollout_id=f"s{step}g{gi}-{i}", group_id=f"s{step}g{gi}",
                reward=float(i % 2), harness="bench",
            ))  # fmt: skip
    return rows


async def _collect(backend: Any, request: GenerationRequest) -> list[tuple[list[int], list[float], int]]:
    out: dict[int, tuple[list[int], list[float], int]] = {}
    async for deltas in backend.generate(request):
        for d in deltas:
            ids, lps, _ = out.setdefault(d.index, ([], [], d.policy_version))
            ids += d.token_ids
            lps += [t.logprob for t in d.logprobs or ()]
    return [out[i] for i in sorted(out)]


class Bench(GRPOModule):
    """Samples its own rows every step (rank 0, broadcast), so they follow the last push. Rank 0
    holds the engine; the other ranks' syncs only join the gathers (WeightSync.follow)."""

    def __init__(self, args: argparse.Namespace, **kw: Any) -> None:
        super().__init__(**kw)
        self.args, self.backend, self.records = args, None, []

    def on_fit_start(self) -> None:
        if self.global_rank == 0:
            from polar_pl.engine.transformers_backend import TransformersBackend

            cuda = self.args.device == "cuda"
            self.backend = TransformersBackend(self.model_dir, device="cuda:0" if cuda else "cpu",
                                               dtype="bfloat16" if cuda else None,
                                               max_batch_size=self.args.group_size)  # fmt: skip
            self.backend.start()
        assert self.weight_sync is not None
        self.weight_sync.bind(LocalEngine(self.backend))  # type: ignore[arg-type]  # the two methods a push calls
        super().on_fit_start()

    def on_fit_end(self) -> None:
        super().on_fit_end()
        if self.backend is not None:
            self.backend.close()

    def training_step(self, batch: Any, batch_idx: int) -> None:
        device = next(self.model.parameters()).device
        t0 = time.perf_counter()
        rows = sample(self.backend, self.args, batch_idx) if self.global_rank == 0 else None
        rows = self.trainer.strategy.broadcast(rows, src=0)
        train = collate(rows, token_budget=self.args.token_budget)
        _sync(device)
        t1 = time.perf_counter()
        m = self.update(train, self.optimizers())  # type: ignore[arg-type]
        _sync(device)
        t2 = time.perf_counter()
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
        peak = float(self.trainer.strategy.reduce(torch.tensor(peak, device=device), reduce_op="max"))
        self.records.append({
            "sample_s": t1 - t0, "step_s": t2 - t1, "push_s": m["train/push_s"], "push_mb": m["train/push_mb"],
            "gap": m["train/logprob_gap_mean"], "tokens": int(train.total_tokens - train.padding_tokens),
            "flops": update_flops(self.model, train), "peak_gib": peak, "version": m["train/policy_version"],
        })  # fmt: skip


def update_flops(model: Any, batch: Any) -> float:
    """The training forward and its backward (twice a forward) over the batch's rows; a sharded
    parameter's numel() is its whole size."""
    cfg = model.config
    lengths = torch.bincount(batch.row_index[batch.row_index >= 0].flatten().cpu()).double()
    attn = 2.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * float((lengths**2).sum())
    return 3.0 * (2.0 * matmul_params(model) * float(lengths.sum()) + attn)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_shape(shape: str, work: Path) -> Path:
    """Qwen3 of `shape` with random weights and Qwen's tokenizer, as an HF folder (once)."""
    out = work / shape
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, Qwen3Config

    from polar_pl.tinymodel.qwen_vocab import qwen_tokenizer
    from polar_pl.tinymodel.tokenizer import save_tokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**SHAPES[shape]), dtype=torch.bfloat16)
    model.save_pretrained(out)
    save_tokenizer(qwen_tokenizer(), out, model_max_length=4096)
    return out


def report(records: list[dict], world: int, peak_tflops: float | None, out: Path | None) -> dict:
    timed = records[1:] or records  # the first step warms up
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in timed[0]}
    tflops = mean["flops"] / mean["step_s"] / 1e12
    summary = {**mean, "steps": len(records), "world": world, "tflops": tflops,
               "mfu": tflops / (peak_tflops * world) if peak_tflops else None,
               "gaps": [r["gap"] for r in records], "versions": [r["version"] for r in records]}  # fmt: skip
    mfu = f"{summary['mfu']:.1%}" if summary["mfu"] is not None else "n/a (no GPU peak)"
    print(f"gpu_fsdp: {world} rank(s), {len(timed)} timed step(s): step {mean['step_s']:.2f} s "
          f"(+ sampling {mean['sample_s']:.2f} s), {mean['tokens']:.0f} tokens, {tflops:.1f} TFLOP/s, MFU {mfu}, "
          f"push {mean['push_s']:.2f} s ({mean['push_mb']:.0f} MB), fresh logprob gap {mean['gap']:.2e}, "
          f"peak {mean['peak_gib']:.1f} GiB/rank", flush=True)  # fmt: skip
    if out is not None:
        out.write_text(json.dumps(summary, indent=2))
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="an HF folder (else --shape)")
    ap.add_argument("--shape", default="qwen3-1.7b", choices=sorted(SHAPES))
    ap.add_argument("--work", default="/tmp/gpu-fsdp", help="where --shape models and pushes are written")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--token-budget", type=int, default=8192, help="tokens per packed sequence")
    ap.add_argument("--param-dtype", default=None, help="FSDP's gather dtype (bfloat16); default fp32")
    ap.add_argument("--peak-tflops", type=float, default=None, help="override the GPU's dense bf16 peak")
    ap.add_argument("--out", default=None, help="write the summary as JSON here")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    work = Path(args.work)
    model_dir = Path(args.model) if args.model else build_shape(args.shape, work)
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=args.devices, strategy=FSDPStrategy(param_dtype=args.param_dtype),
        precision="bf16-mixed" if cuda else "32-true", max_steps=args.steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    sync = DiskSync(dir=str(work / "push"), dtype="bfloat16" if cuda else None)
    settings = GRPOSettings(lr=1e-6, micro_batch_size=1, gradient_checkpointing=True)
    module = Bench(args, model_dir=model_dir, settings=settings, weight_sync=sync)
    trainer.fit(module, train_dataloaders=DataLoader(range(args.steps), batch_size=None))
    if trainer.global_rank == 0:
        peak = None
        if cuda:
            name = torch.cuda.get_device_name(0)
            peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        report(module.records, trainer.world_size, peak, Path(args.out) if args.out else None)


if __name__ == "__main__":
    main()
