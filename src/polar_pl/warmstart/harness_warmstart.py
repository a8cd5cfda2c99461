"""Warm start for one harness: fine-tune the tiny model inside that harness's real request.

A model warm-started on short chats breaks down behind a real CLI's prompt (Claude Code sends
~15k tokens of system prompt, tool schemas and environment before the task): measured, it
repeats one word until the token cap. So it is trained on continuations of the harness's
captured request (harness_capture.py, harness_conversations.py), the loss on assistant tokens.

Backpropagating through a 15k-token context costs seconds per step on a CPU, so the context is
treated the way prefix caching treats it at inference: its KV is computed without gradients
(harness_data.py: `Group` prefixes) and only the segment after it is trained. Gradients then
reach the prefix's keys only through the segment's own projections, and the KV must be
recomputed with the current weights often: a model trained on KV that went stale over the last
30% of its budget had learnt to decode from that stale KV, and behind fresh KV (what inference
computes) it wrote `<tool_call>\n<tool_call>\n` and prose where it had just been trained to
write the call. So the KV is refreshed whenever the time since the last refresh exceeds
`refresh_ratio` times what that refresh took (a cheap prefix is refreshed every few steps), and
once more at `final_refresh` of the budget, after which the learning rate is low. Long steps also attend to only the last `keep_last` prefix positions and
a random `keep_frac` of the rest (positions live in the keys, so RoPE still sees true distances),
which is what makes a step on Claude Code's request affordable. Only prefixes longer than
`subsample_over` are thinned: thinning changes what the tail attends to, and on pi's 1.7k-token
request a model trained on thinned prefixes copied the tool list (`"name": "bash", "bash", ...`)
when sampled behind the full one.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from polar_pl.engine.kvcache import with_cache
from polar_pl.warmstart.chat_warmstart import set_lr
from polar_pl.warmstart.harness_capture import HarnessPrompt
from polar_pl.warmstart.harness_data import IGNORE, Group, compute_kvs, long_groups, short_group


def _pad(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), IGNORE)
    for r, (ids, labs) in enumerate(rows):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        labels[r, : len(labs)] = torch.tensor(labs)
    return input_ids, labels


def step_loss(
    model, group: Group, rows, pad_id: int, keep_last: int, keep_frac: float, gen: torch.Generator
) -> torch.Tensor:
    """Next-token cross entropy of `rows` behind the group's prefix KV, on labelled positions.

    Rows are right-padded, so no attention mask is needed (padding only follows real tokens).
    hidden: (B, T, H); the LM head runs on labelled positions only.
    """
    input_ids, labels = _pad(rows, pad_id)
    b, t = input_ids.shape
    p = len(group.prefix)
    kv = group.kv
    assert kv is not None  # computed by compute_kvs
    far = max(0, p - keep_last)
    if keep_frac < 1.0 and far > 0:
        picked = torch.randperm(far, generator=gen)[: int(far * keep_frac)].sort().values
        idx = torch.cat([picked, torch.arange(far, p)])
        kv = [(k.index_select(2, idx), v.index_select(2, idx)) for k, v in kv]
    cache = (
        DynamicCache(ddp_cache_data=[(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv])
        if p
        else None
    )
    positions = torch.arange(p, p + t).expand(b, -1)
    hidden = model.model(
        input_ids=input_ids,
        position_ids=positions,
        **with_cache(model.model, cache),
        use_cache=cache is not None,
    )
    targets = labels[:, 1:]
    keep = targets != IGNORE
    return torch.nn.functional.cross_entropy(
        model.lm_head(hidden.last_hidden_state[:, :-1][keep]), targets[keep]
    )


@dataclass(slots=True)
class _Freshness:
    """When one family's prefix KV was last computed, and what that cost."""

    at: float | None = None
    cost: float = 0.0
    spent: float = 0.0
    final_done: bool = False

    def due(self, elapsed: float, progress: float, schedule: Schedule) -> bool:
        if self.at is None or (not self.final_done and progress >= schedule.final_refresh):
            return True
        return elapsed - self.at > schedule.refresh_ratio * self.cost

    def done(self, at: float, cost: float, progress: float, schedule: Schedule) -> None:
        self.at, self.cost, self.spent = at + cost, cost, self.spent + cost
        self.final_done = self.final_done or progress >= schedule.final_refresh


@dataclass(frozen=True, slots=True)
class Schedule:
    """minutes: the whole budget; steps: instead, a fixed number of steps (the same training on
    any machine); short_first: its share spent on short rows before any long one;
    long_share: the chance of a long step afterwards; refresh_ratio / final_refresh: when the
    prefix KV is recomputed (for Claude Code each costs about three prefills of its request)."""

    minutes: float = 3.0
    steps: int | None = None
    short_first: float = 0.3
    long_share: float = 0.6
    refresh_ratio: float = 4.0
    final_refresh: float = 0.85
    batch: int = 8
    peak_lr: float = 5e-3
    subsample_over: int = 6000
    keep_last: int = 1024
    keep_frac: float = 0.35
    bf16: bool = False  # bf16 autocast (a real model on a CPU with AVX-512 BF16: ~2x faster steps)


def train(
    model: PreTrainedModel, long: list[Group], short: Group, pad_id: int, schedule: Schedule, seed: int
) -> dict[str, Any]:
    """AdamW over short and long steps until the time budget (or `schedule.steps`) runs out, cosine
    on the share of it used."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=schedule.peak_lr, weight_decay=0.0, betas=(0.9, 0.98))
    budget = schedule.minutes * 60.0
    started = time.monotonic()
    counts = {"short": 0, "long": 0, "refresh": 0}
    losses: dict[str, list[float]] = {"short": [], "long": []}
    fresh = {"long": _Freshness(), "short": _Freshness()}
    model.train()
    while True:
        elapsed = time.monotonic() - started
        done = counts["short"] + counts["long"]
        progress = elapsed / budget if schedule.steps is None else done / schedule.steps
        if progress >= 1.0:
            break
        set_lr(opt, schedule.peak_lr, done, progress)
        is_long = progress >= schedule.short_first and rng.random() < schedule.long_share
        kind = "long" if is_long else "short"
        if fresh[kind].due(elapsed, progress, schedule):
            t0 = time.monotonic()
            compute_kvs(model, long if is_long else [short])
            fresh[kind].done(t0 - started, time.monotonic() - t0, progress, schedule)
            counts["refresh"] += 1
        group = rng.choice(long) if is_long else short
        rows = rng.sample(group.rows, min(schedule.batch, len(group.rows)))
        thin = len(group.prefix) > schedule.subsample_over
        keep_frac = schedule.keep_frac if thin else 1.0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=schedule.bf16):
            loss = step_loss(model, group, rows, pad_id, schedule.keep_last, keep_frac, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        counts[kind] += 1
        losses[kind].append(loss.item())
    model.eval()
    return {
        "seconds": round(time.monotonic() - started, 1),
        "steps": counts,
        "refresh_seconds": round(sum(f.spent for f in fresh.values()), 1),
        "loss_first": {k: round(v[0], 3) for k, v in losses.items() if v},
        "loss_last20": {k: round(sum(v[-20:]) / len(v[-20:]), 3) for k, v in losses.items() if v},
        "loss_last": {k: round(v[-1], 3) for k, v in losses.items() if v},
    }


def warm_start_harness(
    model: PreTrainedModel,
    tok,
    prompt: HarnessPrompt,
    seed: int = 0,
    schedule: Schedule = Schedule(),
    n_upper: int = 4,
    per_task: int = 32,
) -> dict[str, Any]:
    """Fine-tune `model` in place for `prompt`'s harness; returns the report with an evaluation on
    tasks RL will use."""
    from polar_pl.warmstart.harness_conversations import shell_tool
    from polar_pl.warmstart.harness_eval import evaluate

    t0 = time.monotonic()
    long = long_groups(tok, prompt, seed, n_upper, per_task, shared_rows=1500)
    short = short_group(tok, prompt, seed, 1500)
    prep_s = time.monotonic() - t0
    report = train(model, long, short, tok.pad_token_id or 0, schedule, seed)
    t1 = time.monotonic()
    after = evaluate(model, tok, prompt, shell_tool(prompt.tools).name, seed=seed)
    return {
        "harness": prompt.harness,
        "harness_version": prompt.version,
        "mode": "per_task" if long[0].task else "shared",
        "prefix_tokens": sorted({len(g.prefix) for g in long}),
        "prep_seconds": round(prep_s, 1),
        **report,
        "eval_seconds": round(time.monotonic() - t1, 1),
        "after": after,
    }
