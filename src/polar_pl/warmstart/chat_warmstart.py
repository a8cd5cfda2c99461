"""Warm start: a few CPU minutes of supervised fine-tuning on generated chat and tool-use conversations.

A randomly initialized model never closes a `<tool_call>` block, so CPU rollouts would contain no
tool use at all. Training on conversations rendered through the model's own chat template, with the
loss on assistant tokens only, teaches it the hermes format and the ChatML turn structure. The
well-formed tool-call rate is measured on held-out prompts before and after, greedy and sampled.
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedModel

from polar_pl.tinymodel.conversations import generate
from polar_pl.tinymodel.tokenizer import ENDOFTEXT, IM_END, IM_START, render_chat
from polar_pl.warmstart.toolcall_eval import eval_prompts, score_tool_calls

IGNORE = -100


def assistant_mask(ids: list[int], tok: Tokenizer) -> list[bool]:
    """True on assistant turn tokens after `<|im_start|>assistant\\n`, through that turn's `<|im_end|>`."""
    im_start, im_end = tok.token_to_id(IM_START), tok.token_to_id(IM_END)
    header = tok.encode("assistant\n").ids
    mask = [False] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i] == im_start and ids[i + 1 : i + 1 + len(header)] == header:
            j = i + 1 + len(header)
            while j < len(ids) and ids[j] != im_end:
                mask[j] = True
                j += 1
            if j < len(ids):
                mask[j] = True  # learn to stop
            i = j
        i += 1
    return mask


def training_examples(
    tok: Tokenizer, seed: int, count: int, max_len: int
) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) pairs; labels are IGNORE outside assistant turns; long ones are dropped."""
    examples = []
    # At most three tools per prompt: short prompts mean more steps in the CPU budget.
    for conv in generate(seed, count, tool_fraction=0.85, max_tools=3):
        ids = tok.encode(render_chat(conv.messages, conv.tools)).ids
        if len(ids) > max_len:
            continue
        examples.append(labelled(ids, tok))
    return examples


def labelled(ids: list[int], tok: Tokenizer) -> tuple[list[int], list[int]]:
    """(ids, labels): labels are the ids on assistant turns (assistant_mask), IGNORE elsewhere."""
    mask = assistant_mask(ids, tok)
    return ids, [t if m else IGNORE for t, m in zip(ids, mask, strict=True)]


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id)
    labels = torch.full((len(examples), width), IGNORE)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention


def assistant_loss(
    model: PreTrainedModel, input_ids: torch.Tensor, labels: torch.Tensor, attention: torch.Tensor
) -> torch.Tensor:
    """Next-token cross entropy on labelled positions only.

    input_ids, labels, attention: (B, T); labels are IGNORE where no loss applies. The LM head runs
    only on the ~20% of positions that carry a label, which is most of the step's cost saved.
    """
    hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state[
        :, :-1
    ]  # (B, T-1, H)
    targets = labels[:, 1:]  # (B, T-1)
    keep = targets != IGNORE
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]), targets[keep])


def set_lr(
    optimizer: torch.optim.Optimizer, peak: float, step: int, progress: float, warmup: int = 10
) -> None:
    """The warm starts' schedule: linear warmup over `warmup` steps, then cosine on `progress`
    (the fraction of the budget or of the steps used) down to 10% of `peak`."""
    lr = peak * min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
    for group in optimizer.param_groups:
        group["lr"] = lr


def train(
    model: PreTrainedModel,
    examples: list[tuple[list[int], list[int]]],
    minutes: float,
    seed: int,
    pad_id: int,
    batch_size: int = 4,
    peak_lr: float = 6e-3,
    warmup_steps: int = 10,
    steps: int | None = None,
) -> dict[str, Any]:
    """AdamW until the time budget runs out (the learning rate decays with elapsed time), or for
    exactly `steps` steps when given (decaying with steps: the same model on a busy machine)."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.0, betas=(0.9, 0.98))
    budget = minutes * 60.0
    started = time.monotonic()
    model.train()
    step, losses, tokens = 0, [], 0
    while (elapsed := time.monotonic() - started) < budget if steps is None else step < steps:
        progress = elapsed / budget if steps is None else step / steps
        set_lr(optimizer, peak_lr, step, progress, warmup_steps)
        input_ids, labels, attention = _batch(rng.sample(examples, batch_size), pad_id)
        loss = assistant_loss(model, input_ids, labels, attention)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        tokens += int(attention.sum())
        step += 1
    model.eval()
    tail = losses[-20:] or [float("nan")]
    return {
        "steps": step,
        "train_tokens": tokens,
        "seconds": round(time.monotonic() - started, 1),
        "loss_first": round(losses[0], 3) if losses else None,
        "loss_last20_mean": round(sum(tail) / len(tail), 3),
    }


def warm_start(
    model: PreTrainedModel,
    out: Path,
    seed: int = 0,
    minutes: float = 3.0,
    eval_count: int = 24,
    max_len: int = 768,
) -> dict[str, Any]:
    """Fine-tune `model` in place with the tokenizer saved in `out`; returns the before/after report."""
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    pad_id = tok.token_to_id(ENDOFTEXT)
    assert pad_id is not None  # the tiny tokenizer always has <|endoftext|>
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    if os.getloadavg()[0] >= (os.cpu_count() or 1):
        # On an oversubscribed host OpenMP threads spin-wait on each other; one thread measured 3-4x faster.
        torch.set_num_threads(1)
    try:
        return _warm_start(model, tok, pad_id, seed, minutes, eval_count, max_len)
    finally:
        torch.set_num_threads(threads)


def _warm_start(
    model: PreTrainedModel,
    tok: Tokenizer,
    pad_id: int,
    seed: int,
    minutes: float,
    eval_count: int,
    max_len: int,
) -> dict[str, Any]:
    # Held-out prompts come from a different seed stream than the training conversations.
    prompts = eval_prompts(seed + 7919, eval_count)
    before = _scores(model, tok, prompts, seed)
    examples = training_examples(tok, seed + 1, count=4000, max_len=max_len)
    report = train(model, examples, minutes, seed, pad_id)
    after = _scores(model, tok, prompts, seed)
    return {
        "minutes": minutes,
        "threads": torch.get_num_threads(),
        "examples": len(examples),
        **report,
        "before": before,
        "after": after,
    }


def _scores(model: PreTrainedModel, tok: Tokenizer, prompts: list[tuple[str, set[str]]], seed: int) -> dict:
    return {
        "greedy": score_tool_calls(model, tok, prompts).as_dict(),
        "sampled_t0.7": score_tool_calls(model, tok, prompts, temperature=0.7, seed=seed).as_dict(),
    }
