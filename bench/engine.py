"""Embedded engine vs vLLM's CPU build on the tiny model: throughput and latency under load.

    .venv/bin/python bench/engine.py [--model DIR] [--levels 1,8,32] [--max-tokens 64] [--threads 1,2]

Both engines run as their own processes (the embedded one via `polar-pl engine`), the load
generator is an asyncio client in this process. At each concurrency level C, C workers each send
`--rounds` chat requests back to back (fixed length: ignore_eos), so C requests are always in
flight. Reports generated tokens/s over the level's wall time and per-request latency (p50, p95),
side by side with ratios (embedded / vLLM; above 1 means the embedded engine is higher).
`--threads 1,2` runs the embedded engine once per torch thread count (`polar-pl engine --threads`;
default: the engine's own default, half the cores), one block of rows each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.vllm_engine import VLLMEngine, vllm_installed

PROMPT = [
    {"role": "system", "content": "You are a coding agent working in a Python repository."},
    {"role": "user", "content": "Read setup.py, then explain how the package is built and tested."},
]


async def run_level(base_url: str, model: str, concurrency: int, rounds: int, max_tokens: int) -> dict:
    latencies: list[float] = []
    tokens = 0
    body = {
        "model": model,
        "messages": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }

    async def worker(client: httpx.AsyncClient, wid: int) -> None:
        nonlocal tokens
        for r in range(rounds):
            t0 = time.perf_counter()
            resp = await client.post("/chat/completions", json={**body, "seed": wid * 1000 + r})
            resp.raise_for_status()
            latencies.append(time.perf_counter() - t0)
            tokens += resp.json()["usage"]["completion_tokens"]

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client, w) for w in range(concurrency)))
        wall = time.perf_counter() - t0
    latencies.sort()
    return {
        "tok_s": tokens / wall,
        "p50": statistics.median(latencies),
        "p95": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
    }


def bench(engine, levels: list[int], rounds: int, max_tokens: int) -> dict[int, dict]:
    asyncio.run(run_level(engine.base_url, engine.model, 2, 1, 8))  # warm-up
    return {c: asyncio.run(run_level(engine.base_url, engine.model, c, rounds, max_tokens)) for c in levels}


def main() -> None:
    default_model = os.environ.get("POLAR_TINY_MODEL", str(Path.cwd() / ".cache" / "tiny-model"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=default_model)
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--rounds", type=int, default=2, help="requests per worker per level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--threads", default="", help="embedded engine torch threads, e.g. 1,2")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    threads = [int(x) for x in args.threads.split(",")] if args.threads else [None]

    results: dict[str, dict[int, dict]] = {}
    engines: dict = {
        f"embedded/{t}": EmbeddedEngine(args.model, mode="subprocess", max_model_len=4096, num_threads=t)
        for t in threads
    }
    if not args.skip_vllm and vllm_installed():
        engines["vllm"] = VLLMEngine(args.model, dtype="float32", max_model_len=4096)
    for name, engine in engines.items():
        try:
            engine.start()
            results[name] = bench(engine, levels, args.rounds, args.max_tokens)
        finally:
            engine.stop()

    table = Table(
        title=f"engine benchmark: {Path(args.model).name}, {args.max_tokens} tokens/request, "
        f"{args.rounds} requests per worker, {os.cpu_count()} CPUs"
    )
    for col in (
        "threads",
        "concurrency",
        "embedded tok/s",
        "vLLM tok/s",
        "tok/s ratio",
        "embedded p50 s",
        "vLLM p50 s",
        "p50 ratio",
        "embedded p95 s",
        "vLLM p95 s",
    ):
        table.add_column(col, justify="right")
    for t in threads:
        for c in levels:
            e = results[f"embedded/{t}"][c]
            v = results.get("vllm", {}).get(c)
            table.add_row(
                str(t or "default"), str(c), f"{e['tok_s']:.1f}", f"{v['tok_s']:.1f}" if v else "-",
                f"{e['tok_s'] / v['tok_s']:.2f}" if v else "-",
                f"{e['p50']:.2f}", f"{v['p50']:.2f}" if v else "-",
                f"{e['p50'] / v['p50']:.2f}" if v else "-",
                f"{e['p95']:.2f}", f"{v['p95']:.2f}" if v else "-",
            )  # fmt: skip
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
