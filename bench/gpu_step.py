"""One GRPO step on a GPU: tokens/s and MFU for Qwen3-0.6B- and Qwen3-4B-shaped models, and the
time to push the new weights into vLLM.

Models are built from config with random weights (nothing is downloaded), in bf16 with gradient
checkpointing; synthetic rows (a masked prompt quarter, sampled rest) are packed into fixed-size
sequences whose position ids restart per row, exactly as the trainer receives them. The step is the
real `GRPOModule.update`: old logprobs and entropies under no_grad, then one AdamW step
(epochs = minibatches = 1, one packed sequence per micro-batch). A smaller warm-up step runs first.

tokens/s counts the real (non-padding) tokens of the batch per second of the whole step. MFU is
model FLOPs per second over the GPU's dense bf16 peak; model FLOPs are 4 forward passes (the
no-grad logprob pass, the training forward, a backward at twice a forward), each
2 N tokens + 2 layers heads head_dim sum(row_len^2) (causal attention within rows), N the matmul
parameters including the LM head; the recomputation of gradient checkpointing is not counted.

The vLLM push (where vLLM is installed: importable here, or $POLAR_VLLM_PYTHON) writes the trained
weights as safetensors and has a vLLM server reload them (`DiskSync`, the route every engine
serves); the server is started from the model's directory first (not timed).

    python bench/gpu_step.py                 # single H200: both shapes, under 5 minutes
    python bench/gpu_step.py --tiny          # CPU smoke test of the same code: seconds
    python bench/gpu_step.py --tiny --vllm on   # ... with the push into vLLM's CPU build
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from polar_pl.datamodule.collate import TrainBatch, collate
from polar_pl.engine.weights import save_state_dict
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.model import enable_checkpointing
from polar_pl.module.offpolicy import tis_token
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import DiskSync, hf_state_dict
from polar_pl.trajectory.rows import TrajectoryRow

QWEN3 = {"head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1e6,
         "max_position_embeddings": 40960, "rms_norm_eps": 1e-6}  # fmt: skip
SHAPES = {
    "qwen3-0.6b": QWEN3 | {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                           "num_attention_heads": 16, "num_key_value_heads": 8},
    "qwen3-4b": QWEN3 | {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                         "num_attention_heads": 32, "num_key_value_heads": 8},
    # 2 small layers and a small vocabulary: seconds on a CPU.
    "tiny": QWEN3 | {"vocab_size": 8192, "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "head_dim": 16,
                     "num_attention_heads": 4, "num_key_value_heads": 2},
}  # fmt: skip
# Dense bf16 peak TFLOP/s by device name fragment (NVIDIA datasheets, SXM parts).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "B200": 2250.0, "A100": 312.0, "L40S": 362.0}


@dataclass(frozen=True, slots=True)
class Result:
    shape: str
    params: float
    rows: int
    tokens: int
    step_s: float
    tokens_per_s: float
    tflops: float
    mfu: float | None
    peak_gib: float | None
    save_s: float
    push: str


def build_model(shape: str, device: torch.device, dtype: torch.dtype, gradient_checkpointing: bool):
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(**SHAPES[shape], use_cache=False)
    attn = "flash_attention_2" if device.type == "cuda" and importlib.util.find_spec("flash_attn") else "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation=attn)
    if gradient_checkpointing:
        enable_checkpointing(model)
    return model, attn


def make_rows(
    n: int, min_len: int, max_len: int, vocab: int, group_size: int, seed: int
) -> list[TrajectoryRow]:
    """n rows of uniform random length; the first quarter is prompt, the rest sampled; rewards 0/1
    alternate within each group so no group is filtered out."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        prompt = max(1, length // 4)
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        mask = [0] * prompt + [1] * (length - prompt)
        rows.append(TrajectoryRow(
            input_ids=ids, loss_mask=mask, behavior_logprobs=[-11.9 * m for m in mask],
            policy_version=[0 if m else -1 for m in mask], session_id=f"s{i}", rollout_id=f"r{i}",
            group_id=f"g{i // group_size}", reward=float(i % 2), harness="bench",
        ))  # fmt: skip
    return rows


def matmul_params(model) -> int:
    """Parameters of every matmul of a forward, the (tied) LM head included, embeddings excluded."""
    n = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name)
    if model.config.tie_word_embeddings:
        n += model.config.vocab_size * model.config.hidden_size
    return n


def step_flops(model, batch: TrainBatch) -> float:
    cfg = model.config
    lengths = torch.bincount(batch.row_index[batch.row_index >= 0].flatten().cpu()).double()
    tokens = float(lengths.sum())
    attn = 2.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * float((lengths**2).sum())
    return 4.0 * (2.0 * matmul_params(model) * tokens + attn)


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def vllm_python() -> str | None:
    """A Python that has vLLM: this one, else $POLAR_VLLM_PYTHON / a `vllm` script on PATH."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    from polar_pl.engine.vllm_engine import vllm_installed
    from polar_pl.engine.vllm_engine import vllm_python as configured

    return configured() if vllm_installed() else None


def write_model_dir(model, out: Path) -> None:
    """config.json + weights + the Qwen tokenizer (vLLM needs one to serve)."""
    from polar_pl.tinymodel.qwen_vocab import qwen_tokenizer
    from polar_pl.tinymodel.tokenizer import save_tokenizer

    model.config.save_pretrained(out)
    save_state_dict(hf_state_dict(model), out)
    save_tokenizer(qwen_tokenizer(), out, model_max_length=4096)


def vllm_push(model, python: str, device: torch.device, dtype: torch.dtype, timeout: float) -> str:
    """Start vLLM on the model's directory, push the trained weights from disk; the push time."""
    from polar_pl.engine.vllm_engine import VLLMEngine

    with tempfile.TemporaryDirectory(prefix="gpu-step-model-") as tmp:
        write_model_dir(model, Path(tmp))
        extra = ["--gpu-memory-utilization", "0.25"] if device.type == "cuda" else []
        engine = VLLMEngine(tmp, served_model_name="bench", python=python, max_model_len=4096,
                            dtype=str(dtype).removeprefix("torch."), extra_args=extra, startup_timeout=timeout)  # fmt: skip
        try:
            engine.start()
            t = time.perf_counter()
            version = DiskSync().bind(engine).push(model)
            elapsed = time.perf_counter() - t
            return f"{elapsed:.2f} (v{version})"
        finally:
            engine.stop()


def run_shape(shape: str, args, device: torch.device, dtype: torch.dtype, deadline: float) -> Result:
    model, attn = build_model(shape, device, dtype, gradient_checkpointing=not args.no_checkpointing)
    module = GRPOModule(
        model=model,
        settings=GRPOSettings(lr=1e-6, micro_batch_size=1, tis=functools.partial(tis_token, cap=2.0)),
    )
    optimizer = module.configure_optimizers()
    vocab = model.config.vocab_size
    rows = make_rows(args.rows, args.min_len, args.max_len, vocab, args.group_size, seed=1)
    batch = collate(rows, token_budget=args.token_budget)
    warm = collate(rows[: max(2 * args.group_size, 2)], token_budget=args.token_budget)
    module.update(warm, optimizer)  # kernels, allocator, optimizer state
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    flops = step_flops(model, batch)
    sync(device)
    t = time.perf_counter()
    metrics = module.update(batch, optimizer)
    sync(device)
    step_s = time.perf_counter() - t
    assert metrics["train/optimizer_steps"] == 1.0, metrics
    tokens = batch.total_tokens - batch.padding_tokens
    peak = peak_tflops(device, args.peak_tflops)
    with tempfile.TemporaryDirectory(prefix="gpu-step-save-") as tmp:
        t = time.perf_counter()
        save_state_dict(hf_state_dict(model), Path(tmp))
        save_s = time.perf_counter() - t
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    # vLLM needs its share of the GPU: keep only the weights (optimizer state and cached blocks go).
    del module, optimizer
    free_memory(device)
    push = "not installed"
    python = vllm_python() if args.vllm != "off" else None
    if args.vllm == "off":
        push = "off"
    elif python is not None:
        left = deadline - time.monotonic()
        if left < args.vllm_min_s:
            push = f"skipped ({left:.0f}s left)"
        else:
            try:
                push = vllm_push(model, python, device, dtype, timeout=left)
            except Exception as e:
                push = f"failed: {type(e).__name__}: {str(e)[:80]}"
    result = Result(
        shape=f"{shape} ({attn})", params=sum(p.numel() for p in model.parameters()) / 1e9, rows=len(rows),
        tokens=tokens, step_s=step_s, tokens_per_s=tokens / step_s, tflops=flops / step_s / 1e12,
        mfu=(flops / step_s / 1e12 / peak) if peak else None,
        peak_gib=peak_gib, save_s=save_s, push=push,
    )  # fmt: skip
    del model
    free_memory(device)
    return result


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def table(results: list[Result], device: str) -> Table:
    t = Table(title=f"One GRPO step ({device})")
    for col in ("shape", "params", "rows", "tokens", "step s", "tokens/s", "TFLOP/s", "MFU", "peak GiB",
                "save s", "vLLM push s"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("shape", "vLLM push s") else "right")
    for r in results:
        t.add_row(
            r.shape, f"{r.params:.2f}B" if r.params >= 0.1 else f"{r.params * 1e3:.1f}M", str(r.rows), f"{r.tokens:,}", f"{r.step_s:.2f}", f"{r.tokens_per_s:,.0f}",
            f"{r.tflops:.1f}", f"{r.mfu:.1%}" if r.mfu is not None else "n/a",
            f"{r.peak_gib:.1f}" if r.peak_gib is not None else "n/a", f"{r.save_s:.2f}", r.push,
        )  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="a 2-layer model and a small batch (CPU, seconds)")
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=None)
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--min-len", type=int, default=None)
    p.add_argument("--max-len", type=int, default=None)
    p.add_argument("--token-budget", type=int, default=None, help="tokens per packed sequence")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--no-checkpointing", action="store_true")
    p.add_argument("--vllm", choices=("auto", "on", "off"), default="auto",
                   help="push into vLLM where installed (auto: on a GPU only)")  # fmt: skip
    p.add_argument("--vllm-min-s", type=float, default=100.0, help="skip a vLLM push with less time left")
    p.add_argument("--budget-s", type=float, default=280.0, help="wall-clock budget of the whole run")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (CPU runs only)")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's bf16 peak")
    args = p.parse_args(argv)
    started = time.monotonic()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        print("no GPU: run with --tiny for the CPU smoke test", file=sys.stderr)
        return 2
    if args.vllm == "auto" and device.type == "cpu":
        args.vllm = "off"
    defaults = (["tiny"], 16, 16, 96, 256) if args.tiny else (["qwen3-0.6b", "qwen3-4b"], 64, 256, 4096, 8192)
    shapes, rows, lo, hi, budget = defaults
    args.shapes = args.shapes or shapes
    args.rows, args.min_len = args.rows or rows, args.min_len or lo
    args.max_len, args.token_budget = args.max_len or hi, args.token_budget or budget
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cpu":
        torch.set_num_threads(args.threads)  # the tiny model's small matmuls lose to thread hand-offs
    torch.set_float32_matmul_precision("high")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = []
    for shape in args.shapes:
        results.append(run_shape(shape, args, device, dtype, deadline=started + args.budget_s))
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    Console(width=200).print(table(results, f"{name}, {str(dtype).removeprefix('torch.')}"))
    print(f"total wall time {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
