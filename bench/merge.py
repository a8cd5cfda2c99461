"""Trajectory merge end to end from the trace store: tokens/s, and the compression table.

Sessions are shaped like agent-harness traffic: a long system prompt with tools, tool-use loops
whose every prompt resends the whole conversation, plus, at configurable rates, subagents
interleaved with their parent, side calls (titles), compaction, re-render drift, truncated
responses and failed calls. They are written into a real TraceStore (the gateway's own
`append`, packed layout, store/layout.py); throughput counts per-call tokens (prompt + response
of every call, what the merge has to read) over the time to read every session back and merge
it, on the path training takes (`rollout.stages.read_and_merge`: `records(sid, packed=True)`,
then the builder). Side by side in one run, against the 100 M tokens/s target:

- training path: store -> packed records (arrays over the blobs) -> rows (prefix; per_request)
- old path: store -> records as lists (what training read before) -> rows
- the store read alone (packed), and the merge alone on records already in memory
- in-memory list records (no store: what this bench measured before)

    python bench/merge.py                      # ~10 M per-call tokens
    python bench/merge.py --tokens 2e6 --seed 1
    python bench/merge.py --request-bytes 4    # + raw/normalized request text, 4 bytes a prompt token
    python bench/merge.py --cli claude_code,pi # + real CLI sessions, token-faithful on vs off

Measured 2026-12-01 (2 shared CPUs, load average 8-13, 10 M tokens, best of 5): training path
0.064 s = 156 M tokens/s (157 M per CPU-second), the old list path 7.2 M, in-memory lists 12 M;
with `--request-bytes 4` the training path reads 67 M per CPU-second: decoding the records' JSON
then takes most of the read.

`--request-bytes N` puts N bytes of text per prompt token into each record's raw and normalized
request, as real harness requests carry (the whole conversation, every call): the JSON the store
parses for every record grows with it.

`--cli` also runs real harness CLIs (installed by `polar-pl harness install`) through the gateway
on a three-turn tool task (polar_pl.testing.clitrace, scripted engine with the tiny model) once
with token-faithful prompts on and once off, and prints their compression table side by side.
Measured (2 shared CPUs, tiny model, `--cli claude_code,pi,qwen_code`): every CLI made 3 calls;
on: 1 chain, 0 breaks, ratio 2.99 / 2.94 / 2.99 (2 calls spliced each); off: 2 chains, 1 drift
break (the first turn's blank line before `<tool_call>` re-rendered as one newline), ratio 1.50;
on/off 1.99x / 1.96x / 1.99x.

Export of a large store in bounded memory is bench/export.py.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from polar_pl.gateway.store.records import TraceRecord
from polar_pl.gateway.store.traces import TraceStore
from polar_pl.rollout.stages import read_and_merge
from polar_pl.trajectory import BreakKind, MergeStats, PerRequestBuilder, PrefixBuilder

IM_START, IM_END, NL = 1, 2, 3
TARGET = 100e6


def fresh(ids: list[int]) -> list[int]:
    """A copy with its own int objects, as a JSON decode gives (no identity shortcuts in ==)."""
    return np.array(ids, dtype=np.int64).tolist()


class SessionGen:
    """Generates one session's records; token ids are random, the structure is the point."""

    def __init__(
        self, rng: np.random.Generator, sid: str, rates: dict[str, float], request_bytes: float = 0
    ) -> None:
        self.rng, self.sid, self.rates, self.request_bytes = rng, sid, rates, request_bytes
        self.records: list[TraceRecord] = []

    def text(self, lo: int, hi: int) -> list[int]:
        return self.rng.integers(10, 150_000, int(self.rng.integers(lo, hi))).tolist()

    def call(
        self, prompt: list[int], *, kind: str = "main", cut: bool = False, fail: bool = False
    ) -> list[int]:
        resp = [] if fail else self.text(20, 300) + ([] if cut else [IM_END])
        text = "lorem ipsum " * int(len(prompt) * self.request_bytes / 12)
        raw = {"model": "m", "temperature": 1.0, "messages": [{"role": "user", "content": text}]}
        # no "messages" here: breaks are classified on the tokens (the text has no structure)
        normalized = {"model": "m", "temperature": 1.0, "system": text}
        self.records.append(
            TraceRecord(
                session_id=self.sid, call_index=len(self.records), timestamp=0.0, provider="anthropic",
                raw_request=raw, raw_response="", normalized_request=normalized, prompt_ids=fresh(prompt),
                response_ids=resp, response_logprobs=(-self.rng.random(len(resp))).tolist(),
                finish_reason=None if fail else "length" if cut else "stop", policy_version=0, latency_s=0.0,
                status="error" if fail else "ok", error="engine 503" if fail else None, call_kind=kind,
                group_id="g", rollout_id=self.sid,
            )
        )  # fmt: skip
        return resp

    def conversation(self, system: list[int], turns: int, depth: int = 0) -> None:
        r = self.rates
        ctx = [IM_START, *system, IM_END, NL, IM_START, *self.text(30, 400), IM_END, NL, IM_START]
        for _ in range(turns):
            u = self.rng.random(7)
            if u[0] < r["side"]:
                self.call([IM_START, *self.text(100, 300), IM_END, IM_START], kind="side")
            if depth == 0 and u[1] < r["subagent"]:
                self.conversation(self.text(500, 1500), int(self.rng.integers(3, 8)), depth + 1)
            if u[2] < r["fail"]:
                self.call(ctx, fail=True)
            cut = u[3] < r["truncate"]
            resp = self.call(ctx, cut=cut)
            ctx = (
                ctx
                + resp
                + ([IM_END] if cut else [])
                + [NL, IM_START, *self.text(20, 600), IM_END, NL, IM_START]
            )
            if u[4] < r["compact"]:
                ctx = ctx[: len(system) + 4] + [IM_START, *self.text(200, 800), IM_END, NL, IM_START]
            elif u[5] < r["drift"] and len(ctx) > len(system) + 50:
                ctx = list(ctx)
                ctx[int(self.rng.integers(len(system) + 10, len(ctx)))] = 7


def generate(
    total_tokens: float, seed: int, rates: dict[str, float], request_bytes: float = 0
) -> list[TraceRecord]:
    rng = np.random.default_rng(seed)
    system = rng.integers(10, 150_000, 3000).tolist()  # shared by every task session, like a harness's
    records: list[TraceRecord] = []
    n, tokens = 0, 0
    while tokens < total_tokens:
        g = SessionGen(rng, f"s{n}", rates, request_bytes)
        g.conversation(system, int(rng.integers(8, 40)))
        records.extend(g.records)
        tokens += sum(len(r.prompt_ids) + len(r.response_ids) for r in g.records)
        n += 1
    return records


def write_store(records: list[TraceRecord], path: Path) -> list[str]:
    """The records in a TraceStore at `path`, through the gateway's own write path; the session ids."""
    store = TraceStore(path)
    try:
        for rec in records:
            store.append(rec).result()
    finally:
        store.close()
    return list(dict.fromkeys(r.session_id for r in records))


def from_store(
    store: TraceStore, sids: list[str], builder, *, packed: bool, merge: bool = True
) -> MergeStats:
    """Every session read back from the open store (as the gateway keeps it open), and merged:
    on the training path when packed."""
    stats = MergeStats()
    for sid in sids:
        if not merge:
            store.records(sid, packed=packed)
        elif packed:
            stats += read_and_merge(store, builder, sid, reward=1.0, status="ok", harness="bench")[1].stats
        else:  # the old path: lists, then the same builder
            stats += builder.build(store.records(sid), reward=1.0, status="ok", harness="bench").stats
    return stats


def in_memory(by_session: list[list[TraceRecord]], builder) -> MergeStats:
    stats = MergeStats()
    for recs in by_session:
        stats += builder.build(recs, reward=1.0, status="ok", harness="bench").stats
    return stats


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """Best wall and best CPU seconds of `repeat` runs (CPU time: this process alone, what a core
    it has to itself would take; the wall time also counts waiting for a shared CPU)."""
    wall = cpu = float("inf")
    out = None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return wall, cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=10e6, help="per-call tokens to generate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="best of N timings")
    ap.add_argument("--request-bytes", type=float, default=0, help="request text bytes per prompt token")
    ap.add_argument("--cli", default="", help="comma-separated harness CLIs for the real-session table")
    ap.add_argument("--model-dir", default=None, help="tiny model dir (default: $POLAR_TINY_MODEL or .cache)")
    for k, v in RATES.items():
        ap.add_argument(f"--{k}", type=float, default=v, help=f"per-turn rate of {k} (default {v})")
    args = ap.parse_args()
    rates = {k: getattr(args, k) for k in RATES}
    console = Console(width=160)
    t = time.perf_counter()
    records = generate(args.tokens, args.seed, rates, args.request_bytes)
    with tempfile.TemporaryDirectory(prefix="polar-bench-merge-") as tmp:
        path = Path(tmp) / "traces.db"
        sids = write_store(records, path)
        mb = path.stat().st_size / 2**20
        console.print(
            f"generated {len(records)} calls in {len(sids)} sessions, stored ({mb:.0f} MiB) "
            f"in {time.perf_counter() - t:.1f}s"
        )
        by_session = [list(g) for _, g in itertools.groupby(records, key=lambda r: r.session_id)]
        store = TraceStore(path)
        runs = {
            "store -> packed -> prefix rows (training path)": lambda: from_store(store, sids, PrefixBuilder(), packed=True),
            "store -> packed -> per_request rows": lambda: from_store(store, sids, PerRequestBuilder(), packed=True),
            "store -> lists -> prefix rows (old path)": lambda: from_store(store, sids, PrefixBuilder(), packed=False),
            "store read only, packed": lambda: from_store(store, sids, None, packed=True, merge=False),
            "store read only, lists": lambda: from_store(store, sids, None, packed=False, merge=False),
            "in memory, lists -> prefix rows (no store)": lambda: in_memory(by_session, PrefixBuilder()),
        }  # fmt: skip
        results: dict[str, MergeStats] = {}
        timings: dict[str, tuple[float, float]] = {}
        for name, fn in runs.items():
            *timings[name], results[name] = timed(fn, args.repeat)
        store.close()
    first = next(iter(runs))
    total = results[first].call_tokens
    speed = Table(title=f"merge from the store, {total / 1e6:.1f} M per-call tokens (best of {args.repeat})")
    cols = ["what", "wall s", "M tokens/s", "CPU s", "M tokens/CPU-s", f"CPU vs target {TARGET / 1e6:.0f}M/s"]
    for col in [*cols, "CPU vs training path"]:
        speed.add_column(col, justify="right")
    base_cpu = timings[first][1]
    for name, (wall, cpu) in timings.items():
        speed.add_row(
            name, f"{wall:.3f}", f"{total / wall / 1e6:.1f}", f"{cpu:.3f}", f"{total / cpu / 1e6:.1f}",
            f"{total / cpu / TARGET:.2f}x", f"{base_cpu / cpu:.2f}x",
        )  # fmt: skip
    console.print(speed)
    assert results[first] == results["store -> lists -> prefix rows (old path)"]
    assert results[first] == results["in memory, lists -> prefix rows (no store)"]

    table = Table(title=f"compression ({results[first].sessions} generated sessions)")
    cols = ["merge", "calls", "rows", "call tokens", "row tokens", "ratio", "calls/row"]
    cols += [k.value for k in BreakKind]
    for col in cols:
        table.add_column(col, justify="right")
    for name, s in (
        ("prefix", results[first]),
        ("per_request", results["store -> packed -> per_request rows"]),
    ):
        table.add_row(
            name, str(s.calls), str(s.rows), f"{s.call_tokens:,}", f"{s.row_tokens:,}",
            f"{s.compression_ratio:.2f}", f"{s.calls_per_row:.2f}", *(str(s.breaks.get(k, 0)) for k in BreakKind),
        )  # fmt: skip
    console.print(table)
    if args.cli:
        console.print(cli_table([n.strip() for n in args.cli.split(",") if n.strip()], args.model_dir))


def cli_table(names: list[str], model_dir: str | None) -> Table:
    """Real CLI sessions through the gateway, token-faithful prompts on vs off, side by side."""
    from polar_pl.testing.clitrace import run_cli_session
    from polar_pl.testing.scripted import default_model_dir

    model_dir = model_dir or str(default_model_dir())
    table = Table(title="compression on real CLI sessions (3-turn tool task): token-faithful on | off")
    cols = ["harness", "faithful", "calls", "chains", "call tokens", "row tokens", "ratio", "spliced"]
    cols += [k.value for k in BreakKind] + ["ratio on/off"]
    for col in cols:
        table.add_column(col, justify="right")
    for name in names:
        stats = {}
        for on in (True, False):
            tr = run_cli_session(name, token_faithful=on, model_dir=model_dir)
            if tr.exit_code != 0:
                raise SystemExit(f"{name} (token_faithful={on}) exited {tr.exit_code}\n{tr.detail}")
            stats[on] = tr.stats
        for on in (True, False):
            s = stats[on]
            gain = f"{stats[True].compression_ratio / stats[False].compression_ratio:.2f}x" if on else ""
            table.add_row(
                name, "on" if on else "off", str(s.calls), str(s.rows), f"{s.call_tokens:,}", f"{s.row_tokens:,}",
                f"{s.compression_ratio:.2f}", str(s.spliced_calls), *(str(s.breaks.get(k, 0)) for k in BreakKind),
                gain,
            )  # fmt: skip
    return table


RATES = {"side": 0.1, "subagent": 0.05, "fail": 0.02, "truncate": 0.03, "compact": 0.02, "drift": 0.03}

if __name__ == "__main__":
    main()
