"""Warm start for one harness: fine-tune the tiny model inside that harness's real request.

A model warm-started on short chats breaks down behind a real CLI's prompt (Claude Code sends
~15k tokens of system prompt, tool schemas and environment before the task): measured, it
repeats one word until the token cap. So the model is trained on continuations of the harness's
captured request (harness_capture.py, harness_conversations.py), with the loss on the assistant
tokens only.

Backpropagating through a 15k-token context costs seconds per step on a CPU, so the context is
handled the way prefix caching handles it at inference: the KV of each context is computed
without gradients (shared prefix once, then each task's remainder) and the trained tail (the
assistant turns, ~20-150 tokens) attends to it. Gradients then reach the context's keys only
through the tail's own projections; the KV is recomputed with the current weights every
`refresh_s` seconds so it never drifts far from what the weights would produce. To cut the cost
further each long step attends to the last `keep_last` context positions and a random
`keep_frac` of the rest (positions are in the keys, so RoPE still sees the true distances).
Short steps (the same tasks behind a one-paragraph system prompt) teach the formats cheaply.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from polar_pl.chat.render import render_chat
from polar_pl.tinymodel.harness_capture import HarnessPrompt
from polar_pl.tinymodel.harness_conversations import Example, examples, shell_tool

IGNORE = -100
IM_END = "<|im_end|>"


@dataclass(slots=True)
class Context:
    """One task's rendered request (through the generation prompt) and the tails that follow it."""

    task: str
    ids: list[int]
    tails: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (ids, labels)
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer (1, H, T, D)


_STUB = [{"role": "user", "content": "."}]


def _assistant_text(tok, turn: dict[str, Any]) -> str:
    """What the model writes for `turn`: rendered as a history turn of a stub conversation (a user
    message follows, so the template adds no thinking block), cut after its end-of-turn token.
    An assistant turn renders the same whatever came before it, so the stub keeps it cheap."""
    ctx, _ = render_chat(tok, _STUB)
    full, _ = render_chat(tok, [*_STUB, turn, *_STUB], add_generation_prompt=False)
    if not full.startswith(ctx):
        raise ValueError("the chat template does not extend its own generation prompt")
    return full[len(ctx) :].split(IM_END)[0] + IM_END


def _tool_glue(tok, turn: dict[str, Any], text: str, result: dict[str, Any]) -> str:
    """The template's text between an assistant turn and the next generation prompt, through the
    tool result (rendered in the stub conversation: it does not depend on what came before)."""
    ctx, _ = render_chat(tok, _STUB)
    full, _ = render_chat(tok, [*_STUB, turn, result])
    if not full.startswith(ctx + text):
        raise ValueError("re-rendering the conversation changed its earlier text")
    return full[len(ctx) + len(text) :]


def render_tail(tok, ex: Example, memo: dict[str, str] | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The text after the request's generation prompt, and its trainable character spans."""
    memo = {} if memo is None else memo
    tail, spans, last = "", [], None
    for kind, turn in ex.turns:
        if kind == "assistant":
            key = json.dumps(turn, sort_keys=True)
            text = memo.get(key) or memo.setdefault(key, _assistant_text(tok, turn))
            spans.append((len(tail), len(tail) + len(text)))
            tail += text
            last = (turn, text)
        else:
            tail += _tool_glue(tok, last[0], last[1], turn)
    return tail, spans


def tail_tokens(tok, tail: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    enc = tok(tail, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    labels = [
        t if any(a <= s < b for a, b in spans) else IGNORE for t, (s, _) in zip(ids, enc["offset_mapping"])
    ]
    return ids, labels


def build_contexts(tok, prompt: HarnessPrompt, seed: int, n_contexts: int, per_context: int) -> list[Context]:
    """`n_contexts` tasks inside the captured request, each with `per_context` tails."""
    rng = random.Random(seed)
    pool = examples(prompt.harness, prompt.tools, seed, n_contexts * per_context * 4)
    by_task: dict[str, list[Example]] = {}
    for ex in pool:
        by_task.setdefault(ex.task, []).append(ex)
    kinds: dict[str, list[str]] = {}
    for task, exs in by_task.items():
        kinds.setdefault(_kind(exs[0]), []).append(task)
    chosen = []
    while len(chosen) < n_contexts and any(kinds.values()):  # round robin over task kinds
        for names in kinds.values():
            if names and len(chosen) < n_contexts:
                chosen.append(names.pop(rng.randrange(len(names))))
    contexts, memo = [], {}
    for task in chosen:
        workdir = f"/tmp/polar-sbx-default-{rng.randrange(36**8):08x}/workspace"
        _, ids = render_chat(tok, prompt.with_task(task, workdir), prompt.tools)
        ctx = Context(task, ids)
        for ex in by_task[task][:per_context]:
            ctx.tails.append(tail_tokens(tok, *render_tail(tok, ex, memo)))
        contexts.append(ctx)
    return contexts


def short_examples(tok, prompt: HarnessPrompt, seed: int, count: int) -> list[tuple[list[int], list[int]]]:
    """The same tasks behind a short system prompt and the shell tool alone (cheap steps)."""
    tool = shell_tool(prompt.tools)
    tools = [_short_tool(t) for t in prompt.tools if t["function"]["name"] == tool.name]
    system = next((m["content"] for m in prompt.messages if m["role"] == "system"), "")[:240]
    out, contexts, memo = [], {}, {}
    for ex in examples(prompt.harness, prompt.tools, seed + 1, count):
        if ex.task not in contexts:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": ex.task}]
            contexts[ex.task] = render_chat(tok, messages, tools)[1]
        ctx_ids = contexts[ex.task]
        ids, labels = tail_tokens(tok, *render_tail(tok, ex, memo))
        out.append((ctx_ids + ids, [IGNORE] * len(ctx_ids) + labels))
    return out


def _short_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {"type": "function", "function": {**fn, "description": (fn.get("description") or "")[:120]}}


def _kind(ex: Example) -> str:
    if len(ex.turns) > 1:
        return "file"
    return "echo" if ex.task.startswith("Reply with exactly") else "uppercase"


@torch.no_grad()
def compute_kvs(model: PreTrainedModel, contexts: list[Context], chunk: int = 4096) -> None:
    """Each context's KV with the current weights; the prefix all contexts share is computed once."""
    shared = len(contexts[0].ids)
    for c in contexts[1:]:
        n = min(shared, len(c.ids))
        shared = next((i for i in range(n) if c.ids[i] != contexts[0].ids[i]), n)
    shared = min(shared, min(len(c.ids) for c in contexts) - 1)
    base = _extend(model, DynamicCache(), contexts[0].ids[:shared], chunk)
    base_kv = [(layer.keys, layer.values) for layer in base.layers]
    for c in contexts:
        cache = _extend(model, DynamicCache(ddp_cache_data=base_kv), c.ids[shared:], chunk)
        c.kv = [(layer.keys, layer.values) for layer in cache.layers]


def _extend(model, cache: DynamicCache, ids: list[int], chunk: int) -> DynamicCache:
    for start in range(0, len(ids), chunk):
        model.model(input_ids=torch.tensor([ids[start : start + chunk]]), cache=cache, use_cache=True)
    return cache


def _pad(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), IGNORE)
    for r, (ids, labs) in enumerate(rows):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        labels[r, : len(labs)] = torch.tensor(labs)
    return input_ids, labels


def _loss(model, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy on labelled positions. hidden: (B, T, H); labels: (B, T)."""
    targets = labels[:, 1:]
    keep = targets != IGNORE
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[:, :-1][keep]), targets[keep])


def long_step_loss(
    model, ctx: Context, rows, pad_id: int, keep_last: int, keep_frac: float, gen: torch.Generator
) -> torch.Tensor:
    """Loss of `rows` (tails right-padded, so no attention mask is needed) behind ctx's KV."""
    input_ids, labels = _pad(rows, pad_id)
    b, t = input_ids.shape
    p = len(ctx.ids)
    far = max(0, p - keep_last)
    if keep_frac < 1.0 and far > 0:
        picked = torch.randperm(far, generator=gen)[: int(far * keep_frac)].sort().values
        idx = torch.cat([picked, torch.arange(far, p)])
        kv = [(k.index_select(2, idx), v.index_select(2, idx)) for k, v in ctx.kv]
    else:
        kv = ctx.kv
    cache = DynamicCache(ddp_cache_data=[(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv])
    positions = torch.arange(p, p + t).expand(b, -1)
    hidden = model.model(input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True)
    return _loss(model, hidden.last_hidden_state, labels)


def short_step_loss(model, rows, pad_id: int) -> torch.Tensor:
    input_ids, labels = _pad(rows, pad_id)
    return _loss(model, model.model(input_ids=input_ids).last_hidden_state, labels)


@dataclass(frozen=True, slots=True)
class Schedule:
    """minutes: the whole budget; short_first: its share spent on short steps before any long one;
    long_share: the chance of a long step afterwards; refresh_every: share of the budget between
    KV recomputations (each costs about three prefills of the request)."""

    minutes: float = 3.0
    short_first: float = 0.35
    long_share: float = 0.6
    refresh_every: float = 0.3  # of the budget; no refresh once less than this share is left
    batch: int = 6
    peak_lr: float = 6e-3
    keep_last: int = 384
    keep_frac: float = 0.15


def train(
    model: PreTrainedModel,
    contexts: list[Context],
    short: list[tuple[list[int], list[int]]],
    pad_id: int,
    schedule: Schedule,
    seed: int,
) -> dict[str, Any]:
    """AdamW over short and long steps until the time budget runs out (cosine on elapsed time)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=schedule.peak_lr, weight_decay=0.0, betas=(0.9, 0.98))
    budget = schedule.minutes * 60.0
    started = time.monotonic()
    counts = {"short": 0, "long": 0, "refresh": 0}
    losses: dict[str, list[float]] = {"short": [], "long": []}
    refreshed_at, refresh_s = -math.inf, 0.0
    model.train()
    while (elapsed := time.monotonic() - started) < budget:
        progress = elapsed / budget
        lr = (
            schedule.peak_lr
            * min(1.0, (sum(counts.values()) + 1) / 10)
            * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        )
        for group in opt.param_groups:
            group["lr"] = lr
        long = progress >= schedule.short_first and rng.random() < schedule.long_share
        stale = (
            elapsed - refreshed_at
        ) / budget > schedule.refresh_every and progress < 1 - schedule.refresh_every
        if long and (refreshed_at == -math.inf or stale):
            t0 = time.monotonic()
            compute_kvs(model, contexts)
            refreshed_at, refresh_s = time.monotonic() - started, refresh_s + time.monotonic() - t0
            counts["refresh"] += 1
        if long:
            ctx = rng.choice(contexts)
            rows = rng.sample(ctx.tails, min(schedule.batch, len(ctx.tails)))
            loss = long_step_loss(model, ctx, rows, pad_id, schedule.keep_last, schedule.keep_frac, gen)
        else:
            loss = short_step_loss(model, rng.sample(short, schedule.batch), pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        kind = "long" if long else "short"
        counts[kind] += 1
        losses[kind].append(loss.item())
    model.eval()
    return {
        "seconds": round(time.monotonic() - started, 1),
        "steps": counts,
        "refresh_seconds": round(refresh_s, 1),
        "loss_last20": {k: round(sum(v[-20:]) / len(v[-20:]), 3) for k, v in losses.items() if v},
    }


def warm_start_harness(
    model: PreTrainedModel,
    tok,
    prompt: HarnessPrompt,
    seed: int = 0,
    schedule: Schedule = Schedule(),
    n_contexts: int = 6,
    per_context: int = 32,
) -> dict[str, Any]:
    """Fine-tune `model` in place for `prompt`'s harness; returns the report (with a held-out eval)."""
    from polar_pl.tinymodel.harness_eval import evaluate

    t0 = time.monotonic()
    contexts = build_contexts(tok, prompt, seed, n_contexts, per_context)
    seen = {c.task for c in contexts}
    held_out = [c for c in build_contexts(tok, prompt, seed + 7919, 6, 1) if c.task not in seen][:3]
    short = short_examples(tok, prompt, seed, 1200)
    prep_s = time.monotonic() - t0
    report = train(model, contexts, short, tok.pad_token_id or 0, schedule, seed)
    t1 = time.monotonic()
    after = evaluate(model, tok, held_out, shell_tool(prompt.tools).name, seed=seed)
    return {
        "harness": prompt.harness,
        "harness_version": prompt.version,
        "context_tokens": [len(c.ids) for c in contexts],
        "prep_seconds": round(prep_s, 1),
        **report,
        "eval_seconds": round(time.monotonic() - t1, 1),
        "after": after,
    }
