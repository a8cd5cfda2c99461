"""Warm start for the real-CLI learning check: the `case` task inside a harness's own request.

The learning check must show the policy learning something a degenerate answer cannot fake. The
`uppercase` task does not: through pi, GRPO raised its reward with "UUUUUUUU..." (measured,
bench/cli_learning.py). The `case` task asks for capitals or lowercase by prompt, so any answer
that ignores the prompt scores at most 0.5 on average; from a model with no preference GRPO
collapsed onto a prompt-blind case ("xtxtxt", "ririri") through pi just as the mini agent's did.
So, as for the multi-turn check (multiturn_warmstart.py), the check starts from a model that reads
the prompt a little: the tiny model fine-tuned inside the CLI's captured request (harness_data.py's
no-grad prefix KV, loss on the answer) on `case` tasks whose answers have each word in the asked
case with probability `share`, then the end of the turn. RL has to raise that share, which only
reading the prompt does.

Fixed steps, not a time budget: the same model on a busy machine. The prefix KV is recomputed
every `refresh_every` steps (harness_warmstart.py says why it must be fresh).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from transformers import PreTrainedModel

from polar_pl.chat.render import render_chat
from polar_pl.tasks.learnable import learnable_task
from polar_pl.warmstart.chat_warmstart import set_lr
from polar_pl.warmstart.harness_capture import HarnessPrompt
from polar_pl.warmstart.harness_conversations import Example
from polar_pl.warmstart.harness_data import (
    MAX_SEGMENT_PROMPT,
    Group,
    compute_kvs,
    lcp,
    per_task_group,
    sandbox_workdir,
    segment_row,
)
from polar_pl.warmstart.harness_warmstart import Schedule, step_loss
from polar_pl.warmstart.multiturn_warmstart import WORDS


def case_answer(rng: random.Random, upper: bool, share: float) -> str:
    """4-7 words (enough letters for full credit), each in the asked case (capitals if `upper`)
    with probability `share`."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 7))]
    return " ".join(w.upper() if (rng.random() < share) == upper else w for w in words)


def case_example(rng: random.Random, index: int, seed: int, share: float) -> Example:
    task = learnable_task("case", index, seed)
    assert task.answer_check is not None  # case tasks always have one
    upper = task.answer_check.kind == "uppercase_fraction"
    answer = {"role": "assistant", "content": case_answer(rng, upper, share)}
    return Example(task.prompt, (("assistant", answer),))


def case_groups(tok, prompt: HarnessPrompt, share: float, seed: int, rows: int, n_tasks: int) -> list[Group]:
    """Rows inside the real request. If the requests of different tasks differ only near their
    end (pi: the task is the last message), one group over many random `case` tasks whose prefix
    is what all requests share; otherwise (Claude Code: a long environment block follows the task)
    one group per task of the check's own tasks (`case` tasks 0..n_tasks-1 of seed 0), each
    behind its whole request."""
    rng = random.Random(seed)
    workdir = sandbox_workdir(rng)

    def request(task: str) -> list[int]:
        return render_chat(tok, prompt.with_task(task, workdir), prompt.tools)[1]

    probe = {i: request(learnable_task("case", i, 0).prompt) for i in range(2)}
    shared = lcp(list(probe.values()))
    memo: dict[str, str] = {}
    if max(len(ids) for ids in probe.values()) - shared <= MAX_SEGMENT_PROMPT:
        group = Group("case", probe[0][:shared])
        ctx: dict[str, list[int]] = {}
        for _ in range(rows):
            ex = case_example(rng, rng.randrange(1 << 16), rng.randrange(1, 1 << 30), share)
            ids = ctx.get(ex.task) or ctx.setdefault(ex.task, request(ex.task)[shared:])
            group.rows.append(segment_row(tok, ids, ex, memo))
        return [group]
    groups = []
    for i in range(n_tasks):
        task = learnable_task("case", i, 0).prompt
        exs = [case_example(rng, i, 0, share) for _ in range(max(1, rows // n_tasks))]
        groups.append(per_task_group("case", tok, request(task), exs, memo, task))
    return groups


def warm_start_case(
    model: PreTrainedModel,
    tok,
    prompt: HarnessPrompt,
    share: float = 0.7,
    steps: int = 600,
    seed: int = 0,
    rows: int = 2000,
    n_tasks: int = 4,
    batch: int = 8,
    peak_lr: float = 3e-3,
    refresh_every: int = 20,
) -> dict[str, Any]:
    """Fine-tune `model` in place for exactly `steps` AdamW steps of `batch` rows (warmup, then
    cosine to 10%); returns the report with the sampled reward by case (`evaluate_case`)."""
    groups = case_groups(tok, prompt, share, seed, rows, n_tasks)
    thin = Schedule()
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.0, betas=(0.9, 0.98))
    pad_id = tok.pad_token_id or 0
    losses = []
    model.train()
    for step in range(steps):
        if step % refresh_every == 0:
            compute_kvs(model, groups)
        set_lr(opt, peak_lr, step, step / steps)
        group = groups[step % len(groups)]
        keep_frac = thin.keep_frac if len(group.prefix) > thin.subsample_over else 1.0
        picked = rng.sample(group.rows, min(batch, len(group.rows)))
        loss = step_loss(model, group, picked, pad_id, thin.keep_last, keep_frac, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return {
        "harness": prompt.harness,
        "harness_version": prompt.version,
        "share": share,
        "steps": steps,
        "prefix_tokens": sorted({len(g.prefix) for g in groups}),
        "loss_last20": round(sum(losses[-20:]) / len(losses[-20:]), 3),
        "after": evaluate_case(model, tok, prompt, seed=seed),
    }


def evaluate_case(
    model: PreTrainedModel, tok, prompt: HarnessPrompt, samples: int = 8, seed: int = 0
) -> dict[str, Any]:
    """Sampled (temperature 1) answers to the check's first capitals and lowercase tasks behind
    the whole request: their mean reward (the task's own check), and how often the turn ends."""
    from polar_pl.tasks.answer import score_answer
    from polar_pl.warmstart.harness_eval import sample_after

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed + 7)
    out: dict[str, Any] = {"ended_turn": 0.0}
    for i in range(2):
        task = learnable_task("case", i, 0)
        ctx = Group(
            "probe", render_chat(tok, prompt.with_task(task.prompt, sandbox_workdir(rng)), prompt.tools)[1]
        )
        compute_kvs(model, [ctx])
        assert task.answer_check is not None  # case tasks always have one
        upper = task.answer_check.kind == "uppercase_fraction"
        shares, texts = [], []
        for ids in sample_after(model, ctx, samples, 32, eos, 1.0, seed + i):
            out["ended_turn"] += (ids[-1] == eos) / (2 * samples)
            text = tok.decode(ids, skip_special_tokens=True)
            shares.append(score_answer(task, text))
            texts.append(text[:60])
        out["capitals" if upper else "lowercase"] = {
            "reward": round(sum(shares) / samples, 3),
            "examples": texts[:3],
        }
    out["ended_turn"] = round(out["ended_turn"], 3)
    return out
