"""Full weights vs a LoRA adapter pushed into each engine, on the real model.

    .venv/bin/python bench/push.py [--model DIR] [--rank 16] [--repeats 3] [--no-vllm]

SmolLM2-135M-Instruct (`make real-model`), float32 as the trainer holds it; the adapter is rank
`--rank` on every linear layer (module.lora's default targets) with random A and B, as after some
training. For each engine and each payload, pushed `--repeats` times, alternating full and adapter
(a busy machine slows both alike), the medians of:
- bytes: what the push moves (tensors in memory; the safetensors files written for a disk push);
- push s: the sync's `push(model)` call, from the trainer's side (serialise, send, load, apply);
- pause s: how long the engine answered nothing. A probe thread sends 1-token requests back to
  back through the push; the pause is the longest gap between two answers while the push ran,
  less the probe's own round trip measured before it.
Engines: the embedded engine in-process (`EmbeddedStateDictSync`: a state dict or the adapter's
tensors, merged into the weights) and vLLM's CPU build (`DiskSync`: `reload_weights` of the
safetensors folder vs `/v1/load_lora_adapter` of PEFT's folder), when it is installed. Ends with
one summary line of the adapter / full ratios.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time
from pathlib import Path
from typing import Self

import httpx
import torch
from rich.console import Console
from rich.table import Table

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.vllm_engine import VLLMEngine, vllm_installed
from polar_pl.module.lora import LoraSpec, adapter_state, attach
from polar_pl.module.model import load_model
from polar_pl.module.weight_sync import DiskSync, EmbeddedStateDictSync, hf_state_dict

ROOT = Path(__file__).resolve().parents[1]


class Probe:
    """1-token completions back to back on a thread; `longest_gap(t0, t1)` is the longest time
    between two answers (or the window's edges) within [t0, t1]."""

    def __init__(self, engine) -> None:
        self.engine, self.done = engine, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.engine.base_url, timeout=600) as client:
            while not self._stop.is_set():
                body = {
                    "model": self.engine.served_model_name,
                    "prompt": [1, 2, 3],
                    "max_tokens": 1,
                    "temperature": 0,
                }
                r = client.post("/completions", json=body)
                if r.status_code == 200:
                    self.done.append(time.perf_counter())

    def __enter__(self) -> Self:
        self._thread.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def round_trip(self) -> float:
        gaps = [b - a for a, b in itertools.pairwise(self.done)]
        return statistics.median(gaps) if gaps else 0.0

    def longest_gap(self, t0: float, t1: float) -> float:
        before = [t for t in self.done if t <= t0]
        inside = [t for t in self.done if t0 < t]  # the first answer after the push ends the pause
        marks = ([before[-1]] if before else [t0]) + [t for t in inside if t <= t1]
        after = [t for t in inside if t > t1]
        marks.append(after[0] if after else t1)
        return max(b - a for a, b in itertools.pairwise(marks))


def payload_bytes(model, is_adapter: bool) -> int:
    tensors = adapter_state(model)[0] if is_adapter else hf_state_dict(model)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def measure(engine, sync, models: dict, repeats: int, disk_dir: Path | None) -> dict[str, dict]:
    out: dict[str, dict] = {name: {"push": [], "pause": [], "bytes": 0} for name in models}
    with Probe(engine) as probe:
        rtt = probe.round_trip()
        for _ in range(repeats):
            for name, model in models.items():
                time.sleep(0.5)  # answers before the push
                t0 = time.perf_counter()
                sync.push(model)
                t1 = time.perf_counter()
                time.sleep(0.5 + 2 * rtt)  # the first answer after it
                out[name]["push"].append(t1 - t0)
                out[name]["pause"].append(max(0.0, probe.longest_gap(t0, t1) - rtt))
                is_adapter = name == "adapter"
                out[name]["bytes"] = disk_bytes(disk_dir) if disk_dir else payload_bytes(model, is_adapter)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / ".cache/smollm2-135m-instruct"))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()
    model_dir = Path(args.model)
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"no model at {model_dir}: `make real-model` builds it")
    torch.manual_seed(0)
    full = load_model(model_dir)
    peft = attach(load_model(model_dir), LoraSpec(rank=args.rank))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.02)
    models = {"full": full, "adapter": peft}

    results: dict[str, dict] = {}
    with EmbeddedEngine(model_dir, served_model_name="smollm2", max_model_len=512) as eng:
        results["embedded (in memory)"] = measure(
            eng, EmbeddedStateDictSync().bind(eng), models, args.repeats, None
        )
    if not args.no_vllm and vllm_installed():
        disk = Path("/tmp/polar-bench-push")
        disk.mkdir(exist_ok=True)
        with VLLMEngine(
            model_dir, served_model_name="smollm2", max_model_len=2048, max_lora_rank=args.rank
        ) as v:
            results["vLLM CPU (disk)"] = measure(
                v, DiskSync(dir=str(disk)).bind(v), models, args.repeats, disk
            )

    table = Table(
        title=f"push on {model_dir.name}: full weights vs LoRA rank {args.rank} (medians of {args.repeats})"
    )
    for col in ("engine", "payload", "MB", "push s", "pause s"):
        table.add_column(col, justify="right" if col not in ("engine", "payload") else "left")
    summary = []
    for engine, res in results.items():
        for name in models:
            r = res[name]
            table.add_row(engine, name, f"{r['bytes'] / 1e6:.1f}", f"{statistics.median(r['push']):.3f}",
                          f"{statistics.median(r['pause']):.3f}")  # fmt: skip
        f, a = res["full"], res["adapter"]
        summary.append(
            f"{engine}: adapter/full bytes {a['bytes'] / f['bytes']:.3f}, push "
            f"{statistics.median(a['push']) / statistics.median(f['push']):.2f}x, pause "
            f"{statistics.median(a['pause']) / max(statistics.median(f['pause']), 1e-9):.2f}x"
        )
    Console().print(table)
    print("summary: " + "; ".join(summary))


if __name__ == "__main__":
    main()
