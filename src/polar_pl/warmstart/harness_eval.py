"""What the harness warm start is for, measured inside the real request on held-out tasks: the
model ends its turn, calls the harness's shell tool with well-formed JSON on file tasks, and
answers capital-letter tasks sometimes in capitals and sometimes not (reward variance for GRPO)."""

from __future__ import annotations

import json
import re
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from polar_pl.engine.kvcache import with_cache
from polar_pl.warmstart.harness_capture import HarnessPrompt
from polar_pl.warmstart.harness_data import Group, compute_kvs, probe_contexts

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@torch.no_grad()
def sample_after(
    model: PreTrainedModel, ctx: Group, n: int, max_new: int, eos: int, temperature: float, seed: int
) -> list[list[int]]:
    """n continuations of the request `ctx.prefix` (its KV computed) until eos or max_new tokens."""
    gen = torch.Generator().manual_seed(seed)
    p = len(ctx.prefix)
    assert ctx.kv is not None  # computed by compute_kvs
    # The context's last token is run again to get the first next-token logits.
    kv = [(k[:, :, : p - 1].expand(n, -1, -1, -1), v[:, :, : p - 1].expand(n, -1, -1, -1)) for k, v in ctx.kv]
    cache = DynamicCache(ddp_cache_data=kv)
    token = torch.full((n, 1), ctx.prefix[-1])
    out: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    for step in range(max_new):
        logits = model(
            input_ids=token,
            position_ids=torch.full((n, 1), p - 1 + step),
            **with_cache(model, cache),
            use_cache=True,
        ).logits[:, -1]
        if temperature > 0:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)
        else:
            nxt = logits.argmax(-1, keepdim=True)
        for i, t in enumerate(nxt[:, 0].tolist()):
            if not done[i]:
                out[i].append(t)
                done[i] = t == eos
        if all(done):
            break
        token = nxt
    return out


def _caps_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


def evaluate(
    model: PreTrainedModel, tok, prompt: HarnessPrompt, shell: str, samples: int = 4, seed: int = 0
) -> dict[str, Any]:
    """Rates over `samples` sampled (temperature 1) continuations of RL's tasks in the request."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    contexts = [Group("probe", ids, task=task) for task, ids in probe_contexts(tok, prompt, seed)]
    compute_kvs(model, contexts)
    ended, calls_ok, file_n, caps, upper_n, answers = 0, 0, 0, [], 0, []
    total = 0
    for j, ctx in enumerate(contexts):
        for ids in sample_after(model, ctx, samples, 64, eos, 1.0, seed + j):
            total += 1
            text = tok.decode(ids, skip_special_tokens=False)
            answers.append(text[:120])
            ended += ids[-1] == eos
            if "answer.txt" in (ctx.task or ""):
                file_n += 1
                calls_ok += _well_formed(text, shell)
            else:
                upper_n += 1
                caps.append(_caps_share(text.replace("<|im_end|>", "")))
    return {
        "samples": total,
        "ended_turn": round(ended / total, 3),
        "file_tasks_shell_call": round(calls_ok / file_n, 3) if file_n else None,
        "uppercase_caps_share": [round(c, 2) for c in caps],
        "examples": answers[:6],
    }


def _well_formed(text: str, shell: str) -> bool:
    blocks = TOOL_CALL_RE.findall(text)
    if not blocks:
        return False
    try:
        call = json.loads(blocks[0])
    except json.JSONDecodeError:
        return False
    return isinstance(call, dict) and call.get("name") == shell and isinstance(call.get("arguments"), dict)
