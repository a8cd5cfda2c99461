"""Warm-start rows inside a harness's captured request: no-grad prefixes and trained segments.

A row is (prefix, segment, labels): the prefix's KV is computed without gradients (it is shared by
many rows and can be ~15k tokens), the segment is trained with the loss on assistant tokens.
Rows that share a prefix form a `Group`:

- `shared` mode (the task sits near the end of the request, as in pi: system prompt and tools,
  then the user's task): one group whose prefix is what every task's request has in common; the
  segment is the task text onward, so the model learns to read the task. Any task can be used.
- `per_task` mode (a long block follows the task, as Claude Code's ~3k-token environment block):
  one group per task whose prefix is that task's whole request; the segment is the assistant's
  part only. The tasks are the learnable tasks RL will use (harness_conversations.task_examples).
- `short`: the same tasks behind a one-paragraph system prompt and the shell tool alone, in shared
  mode: cheap steps that teach the formats.

Assistant turns and tool-result glue are rendered in a stub conversation (they render the same
whatever came before), so building thousands of rows never re-renders a 50 KB request.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from polar_pl.chat.render import render_chat
from polar_pl.engine.kvcache import with_cache
from polar_pl.warmstart.harness_capture import HarnessPrompt
from polar_pl.warmstart.harness_conversations import Example, examples, shell_tool, task_examples

IGNORE = -100
IM_END = "<|im_end|>"
MAX_SEGMENT_PROMPT = 256  # prompt tokens after the shared prefix that a shared-mode row may train on
_STUB = [{"role": "user", "content": "."}]


@dataclass(slots=True)
class Group:
    """Rows behind one no-grad prefix; `kv` is its KV under the current weights (per layer
    (1, H, T, D)), recomputed by the trainer as the weights move."""

    family: str
    prefix: list[int]
    rows: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (segment ids, labels)
    task: str | None = None
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None


def _assistant_text(tok, turn: dict[str, Any]) -> str:
    """What the model writes for `turn`: a history turn of a stub conversation (a user message
    follows, so the template adds no thinking block), cut after its end-of-turn token."""
    ctx, _ = render_chat(tok, _STUB)
    full, _ = render_chat(tok, [*_STUB, turn, *_STUB], add_generation_prompt=False)
    if not full.startswith(ctx):
        raise ValueError("the chat template does not extend its own generation prompt")
    return full[len(ctx) :].split(IM_END)[0] + IM_END


def _tool_glue(tok, turn: dict[str, Any], text: str, result: dict[str, Any]) -> str:
    """The template's text from the end of an assistant turn through the tool result to the next
    generation prompt."""
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
            assert last is not None  # a tool turn follows an assistant turn
            tail += _tool_glue(tok, last[0], last[1], turn)
    return tail, spans


def tail_tokens(tok, tail: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    enc = tok(tail, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    offsets = enc["offset_mapping"]
    labels = [
        t if any(a <= s < b for a, b in spans) else IGNORE for t, (s, _) in zip(ids, offsets, strict=True)
    ]
    return ids, labels


def lcp(seqs: list[list[int]]) -> int:
    """Length of the prefix all sequences share, leaving at least one token in each."""
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for s in seqs[1:]:
        n = next((i for i in range(n) if s[i] != first[i]), n)
    return n


def sandbox_workdir(rng: random.Random) -> str:
    return f"/tmp/polar-sbx-default-{rng.randrange(36**8):08x}/workspace"


PER_TASK_FILE_WORDS, PER_TASK_UPPER = 4, 2  # per-task KV costs ~3k tokens of prefill each (Claude Code)


def long_groups(
    tok, prompt: HarnessPrompt, seed: int, n_upper: int, per_task: int, shared_rows: int
) -> list[Group]:
    """Groups inside the real request: one shared-mode group if every task's request differs from
    the others only near its end, else one per-task group for each of a few learnable tasks."""
    rng = random.Random(seed)
    memo: dict[str, str] = {}
    by_task = task_examples(prompt.harness, prompt.tools, seed, n_upper, per_task)
    workdir = sandbox_workdir(rng)
    ctx = {t: render_chat(tok, prompt.with_task(t, workdir), prompt.tools)[1] for t in by_task}
    shared = lcp(list(ctx.values()))
    if max(len(c) for c in ctx.values()) - shared <= MAX_SEGMENT_PROMPT:
        group = Group("long", next(iter(ctx.values()))[:shared])
        for ex in examples(prompt.harness, prompt.tools, seed + 2, shared_rows):
            if ex.task not in ctx:
                ctx[ex.task] = render_chat(tok, prompt.with_task(ex.task, workdir), prompt.tools)[1]
            group.rows.append(segment_row(tok, ctx[ex.task][shared:], ex, memo))
        return [group]
    groups = []
    few = task_examples(prompt.harness, prompt.tools, seed, PER_TASK_UPPER, per_task, PER_TASK_FILE_WORDS)
    for task, exs in few.items():
        ids = render_chat(tok, prompt.with_task(task, sandbox_workdir(rng)), prompt.tools)[1]
        groups.append(per_task_group("long", tok, ids, exs, memo, task))
    return groups


def short_group(tok, prompt: HarnessPrompt, seed: int, count: int) -> Group:
    """The tasks behind a short system prompt and the shell tool alone (its required arguments,
    descriptions cut short): cheap rows for the formats."""
    tool = shell_tool(prompt.tools)
    tools = [_short_tool(t) for t in prompt.tools if t["function"]["name"] == tool.name]
    system = next((m["content"] for m in prompt.messages if m["role"] == "system"), "")[:240]
    memo: dict[str, str] = {}
    exs = examples(prompt.harness, prompt.tools, seed + 1, count)
    ctx: dict[str, list[int]] = {}
    for ex in exs:
        if ex.task not in ctx:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": ex.task}]
            ctx[ex.task] = render_chat(tok, messages, tools)[1]
    shared = lcp(list(ctx.values()))
    group = Group("short", next(iter(ctx.values()))[:shared])
    group.rows = [segment_row(tok, ctx[ex.task][shared:], ex, memo) for ex in exs]
    return group


def per_task_group(
    family: str, tok, request: list[int], exs: list[Example], memo: dict[str, str], task: str
) -> Group:
    """Rows behind one task's whole request. The request's last token opens each segment: a
    segment's first token is predicted from the position before it, so with the whole request in
    the prefix the answer's first token would never be trained (measured: Claude Code's warm
    model then opened every answer with junk echoed from the request, "day ..." after "Today's
    date")."""
    return Group(family, request[:-1], [segment_row(tok, request[-1:], ex, memo) for ex in exs], task=task)


def segment_row(tok, prompt_ids: list[int], ex: Example, memo: dict[str, str]) -> tuple[list[int], list[int]]:
    ids, labels = tail_tokens(tok, *render_tail(tok, ex, memo))
    return prompt_ids + ids, [IGNORE] * len(prompt_ids) + labels


def _short_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or {}
    required = list(params.get("required") or [])
    props = {
        k: {**v, "description": str(v.get("description") or "")[:60]}
        for k, v in (params.get("properties") or {}).items()
        if k in required
    }
    parameters = {"type": "object", "properties": props, "required": required}
    description = (fn.get("description") or "")[:120]
    return {"type": "function", "function": {**fn, "description": description, "parameters": parameters}}


def probe_contexts(tok, prompt: HarnessPrompt, seed: int) -> list[tuple[str, list[int]]]:
    """(task, full request ids) for two file tasks and two capital-letter tasks RL will use."""
    rng = random.Random(seed + 5)
    tasks = list(task_examples(prompt.harness, prompt.tools, seed, 2, 1))
    picked = [t for t in tasks if "answer.txt" in t][:2] + [t for t in tasks if "answer.txt" not in t][:2]
    return [(t, render_chat(tok, prompt.with_task(t, sandbox_workdir(rng)), prompt.tools)[1]) for t in picked]


@torch.no_grad()
def compute_kvs(model: PreTrainedModel, groups: list[Group], chunk: int = 4096) -> None:
    """Each group's prefix KV with the current weights; what all prefixes share is computed once."""
    shared = lcp([g.prefix + [0] for g in groups])  # +[0]: a prefix may be the shared part itself
    base = _extend(model, DynamicCache(), groups[0].prefix[:shared], chunk)
    base_kv = [(layer.keys, layer.values) for layer in base.layers] if shared else None  # type: ignore[union-attr]  # transformers: DynamicLayers here
    for g in groups:
        cache = _extend(
            model,
            DynamicCache(ddp_cache_data=base_kv) if base_kv else DynamicCache(),
            g.prefix[shared:],
            chunk,
        )
        g.kv = [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr, misc]  # as above


def _extend(model, cache: DynamicCache, ids: list[int], chunk: int) -> DynamicCache:
    for start in range(0, len(ids), chunk):
        model.model(
            input_ids=torch.tensor([ids[start : start + chunk]]),
            **with_cache(model.model, cache),
            use_cache=True,
        )
    return cache
