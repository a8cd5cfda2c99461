"""Trajectory merge: throughput in tokens/s and the compression table, on generated sessions.

Sessions are shaped like agent-harness traffic: a long system prompt with tools, tool-use loops
whose every prompt resends the whole conversation, plus, at configurable rates, subagents
interleaved with their parent, side calls (titles), compaction, re-render drift, truncated
responses and failed calls. Throughput counts per-call tokens (prompt + response of every call,
what the merge has to read), from TraceRecords holding Python lists, as the store returns them.

Printed side by side, with ratios against the 10 M tokens/s target: the `prefix` and `per_request`
builders end to end (prefix tests, rows, stats), and the bare prefix test three ways: slices of the
record lists compared in C (what `prefix` does), converting to int32 first and comparing with
memcmp, and memcmp on buffers that are int32 already (what a store keeping int32 blobs would give).

    python bench/merge.py                    # >= 1 M per-call tokens
    python bench/merge.py --tokens 5e6 --seed 1
    python bench/merge.py --cli claude_code,pi   # + real CLI sessions, token-faithful on vs off

`--cli` also runs real harness CLIs (installed by `polar-pl harness install`) through the gateway
on a three-turn tool task (polar_pl.testing.clitrace, scripted engine with the tiny model) once
with token-faithful prompts on and once off, and prints their compression table side by side.
Measured (2 shared CPUs, tiny model, `--cli claude_code,pi,qwen_code`): every CLI made 3 calls;
on: 1 chain, 0 breaks, ratio 2.99 / 2.94 / 2.99 (2 calls spliced each); off: 2 chains, 1 drift
break (the first turn's blank line before `<tool_call>` re-rendered as one newline), ratio 1.50;
on/off 1.99x / 1.96x / 1.99x.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from polar_pl.datamodule.trajectory import (
    BreakKind,
    MergeStats,
    PerRequestBuilder,
    PrefixBuilder,
    build_batch,
)
from polar_pl.gateway.store.records import TraceRecord

IM_START, IM_END, NL = 1, 2, 3
TARGET = 10e6


def fresh(ids: list[int]) -> list[int]:
    """A copy with its own int objects, as a JSON decode gives (no identity shortcuts in ==)."""
    return np.array(ids, dtype=np.int64).tolist()


class SessionGen:
    """Generates one session's records; token ids are random, the structure is the point."""

    def __init__(self, rng: np.random.Generator, sid: str, rates: dict[str, float]) -> None:
        self.rng, self.sid, self.rates = rng, sid, rates
        self.records: list[TraceRecord] = []

    def text(self, lo: int, hi: int) -> list[int]:
        return self.rng.integers(10, 150_000, int(self.rng.integers(lo, hi))).tolist()

    def call(
        self, prompt: list[int], *, kind: str = "main", cut: bool = False, fail: bool = False
    ) -> list[int]:
        resp = [] if fail else self.text(20, 300) + ([] if cut else [IM_END])
        self.records.append(
            TraceRecord(
                session_id=self.sid, call_index=len(self.records), timestamp=0.0, provider="anthropic",
                raw_request={}, raw_response="", normalized_request={}, prompt_ids=fresh(prompt),
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


def generate(total_tokens: float, seed: int, rates: dict[str, float]) -> list[TraceRecord]:
    rng = np.random.default_rng(seed)
    system = rng.integers(10, 150_000, 3000).tolist()  # shared by every task session, like a harness's
    records: list[TraceRecord] = []
    n, tokens = 0, 0
    while tokens < total_tokens:
        g = SessionGen(rng, f"s{n}", rates)
        g.conversation(system, int(rng.integers(8, 40)))
        records.extend(g.records)
        tokens += sum(len(r.prompt_ids) + len(r.response_ids) for r in g.records)
        n += 1
    return records


def _sessions(records: list[TraceRecord]) -> list[list[TraceRecord]]:
    by: dict[str, list[TraceRecord]] = {}
    for r in records:
        if r.status == "ok" or r.response_ids:
            by.setdefault(r.session_id, []).append(r)
    return list(by.values())


def check_lists(sessions: list[list[TraceRecord]]) -> int:
    """Prefix test only, as `prefix` does it: slices of the record lists compared in C."""
    chains = 0
    for recs in sessions:
        tips: list[tuple[list[int], list[int]]] = []
        for r in recs:
            p = r.prompt_ids
            hit = [
                i for i, (lp, lr) in enumerate(tips)
                if len(p) >= len(lp) + len(lr) and p[len(lp) : len(lp) + len(lr)] == lr and p[: len(lp)] == lp
            ]  # fmt: skip
            if hit and r.call_kind == "main":
                tips[hit[-1]] = (p, r.response_ids)
            else:
                chains += 1
                if r.call_kind == "main":
                    tips.append((p, r.response_ids))
    return chains


def check_int32(sessions: list[list[tuple[bytes, bytes, str]]]) -> int:
    """Prefix test only on little-endian int32 buffers: `bytes.startswith` is a memcmp."""
    chains = 0
    for recs in sessions:
        tips: list[tuple[bytes, bytes]] = []
        for p, resp, kind in recs:
            hit = [i for i, (lp, lr) in enumerate(tips) if p.startswith(lp) and p.startswith(lr, len(lp))]
            if hit and kind == "main":
                tips[hit[-1]] = (p, resp)
            else:
                chains += 1
                if kind == "main":
                    tips.append((p, resp))
    return chains


def to_int32(sessions: list[list[TraceRecord]]) -> list[list[tuple[bytes, bytes, str]]]:
    return [
        [
            (
                np.array(r.prompt_ids, np.int32).tobytes(),
                np.array(r.response_ids, np.int32).tobytes(),
                r.call_kind,
            )
            for r in recs
        ]
        for recs in sessions
    ]


def timed(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=1.5e6, help="per-call tokens to generate (>= 1e6)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="best of N timings")
    ap.add_argument("--cli", default="", help="comma-separated harness CLIs for the real-session table")
    ap.add_argument("--model-dir", default=None, help="tiny model dir (default: $POLAR_TINY_MODEL or .cache)")
    for k, v in RATES.items():
        ap.add_argument(f"--{k}", type=float, default=v, help=f"per-turn rate of {k} (default {v})")
    args = ap.parse_args()
    rates = {k: getattr(args, k) for k in RATES}
    console = Console(width=160)
    t = time.perf_counter()
    records = generate(args.tokens, args.seed, rates)
    console.print(f"generated {len(records)} calls in {time.perf_counter() - t:.1f}s")

    results: dict[str, MergeStats] = {}
    speed = Table(title=f"merge throughput (per-call tokens / s, best of {args.repeat})")
    for col in ("what", "seconds", "M tokens/s", "vs target 10M/s", "vs prefix builder"):
        speed.add_column(col, justify="right")
    timings: dict[str, float] = {}
    for name, builder in (("prefix builder", PrefixBuilder()), ("per_request builder", PerRequestBuilder())):
        timings[name], res = timed(lambda b=builder: build_batch(b, records), args.repeat)
        results[name.split()[0]] = res.stats
    sessions = _sessions(records)
    timings["prefix test only: list slices"], n_lists = timed(lambda: check_lists(sessions), args.repeat)
    timings["prefix test only: int32 convert + memcmp"], _ = timed(
        lambda: check_int32(to_int32(sessions)), args.repeat
    )
    buffers = to_int32(sessions)
    timings["prefix test only: memcmp on int32 already"], n_i32 = timed(
        lambda: check_int32(buffers), args.repeat
    )
    assert n_lists == n_i32 == results["prefix"].rows, (n_lists, n_i32, results["prefix"].rows)
    total = results["prefix"].call_tokens
    for name, secs in timings.items():
        rate = total / secs
        ratio = timings["prefix builder"] / secs
        speed.add_row(name, f"{secs:.3f}", f"{rate / 1e6:.1f}", f"{rate / TARGET:.2f}x", f"{ratio:.2f}x")
    console.print(speed)

    table = Table(title=f"compression ({results['prefix'].sessions} generated sessions)")
    cols = ["merge", "calls", "rows", "call tokens", "row tokens", "ratio", "calls/row"]
    cols += [k.value for k in BreakKind]
    for col in cols:
        table.add_column(col, justify="right")
    for name, s in results.items():
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
