"""The cold start of tool use: a real instruct model fine-tuned on demonstrations of the `tools`
tasks inside a real CLI's request, before GRPO.

SmolLM2-135M-Instruct never writes a tool call on its own (docs/real-model.md: 0 of 48 samples),
so every attempt at a `tools` task scores 0, no GRPO group has any spread, and RL has nothing to
learn from. What RL practice does then is a short supervised stage first (DeepSeek-R1's "cold
start"): here, one demonstration per train-split task (harness_conversations.tool_task_example:
the product computed by `echo $((a * b))` into the result file; or `cat data.txt`, then the item
copied into it; then a short closing reply), each inside the pinned CLI's captured request
(harness_capture.py) rendered with the model's own template and tool format, loss on the
assistant's tokens only. The request up to the task text is every row's shared prefix, its KV
computed without gradients (harness_data.Group, shared mode), so a step costs the task and the
answer, not the CLI's ~1.4k-token system prompt.

Held-out tasks are never demonstrated (`split_tasks` keeps the test split out of every train
draw). The demonstrations teach the format and the two procedures; whether the model copies the
numbers right, picks the right item and stops is what its held-out score then measures and what
GRPO improves.
"""

from __future__ import annotations

import random
import time
from typing import Any

from transformers import PreTrainedModel

from polar_pl.chat.render import render_chat
from polar_pl.tasks.arith import split_tasks
from polar_pl.warmstart.harness_capture import HarnessPrompt
from polar_pl.warmstart.harness_conversations import Example, tool_task_examples
from polar_pl.warmstart.harness_data import MAX_SEGMENT_PROMPT, Group, lcp, sandbox_workdir, segment_row
from polar_pl.warmstart.harness_warmstart import Schedule, train


def demonstration_group(
    tok, prompt: HarnessPrompt, exs: list[Example], seed: int, workdir: str | None = None
) -> Group:
    """The demonstrations as rows behind what every task's request shares (the request up to the
    task text), each row its task text onward. workdir: the working folder the CLI will see
    (sandbox.workspace_alias; default: a sandbox folder's name drawn from `seed`)."""
    workdir = workdir or sandbox_workdir(random.Random(seed))
    ctx = {ex.task: render_chat(tok, prompt.with_task(ex.task, workdir), prompt.tools)[1] for ex in exs}
    shared = lcp(list(ctx.values()))
    longest = max(len(ids) for ids in ctx.values()) - shared
    if longest > MAX_SEGMENT_PROMPT:
        raise ValueError(
            f"{prompt.harness}: {longest} prompt tokens follow the task text in its request (at most "
            f"{MAX_SEGMENT_PROMPT}): the tool cold start needs the task near the end of the request"
        )
    memo: dict[str, str] = {}
    group = Group("long", next(iter(ctx.values()))[:shared])
    group.rows = [segment_row(tok, ctx[ex.task][shared:], ex, memo) for ex in exs]
    return group


def cold_start_tools(
    model: PreTrainedModel,
    tok,
    prompt: HarnessPrompt,
    steps: int,
    lr: float,
    n_tasks: int,
    seed: int = 0,
    bf16: bool = False,
    workdir: str | None = None,
) -> dict[str, Any]:
    """Fine-tune `model` in place for `steps` steps of 8 rows on demonstrations of `n_tasks` train
    tasks of the `tools` family inside `prompt` (bf16: under bf16 autocast); returns the report."""
    t0 = time.monotonic()
    tasks = split_tasks("tools", "train", n_tasks, seed=seed)
    exs = tool_task_examples(prompt.harness, prompt.tools, tasks, seed)
    group = demonstration_group(tok, prompt, exs, seed, workdir)
    prep_s = time.monotonic() - t0
    schedule = Schedule(
        steps=steps, peak_lr=lr, short_first=0.0, long_share=1.0, subsample_over=1 << 30, bf16=bf16
    )
    report = train(model, [group], group, tok.pad_token_id or 0, schedule, seed)
    return {
        "harness": prompt.harness,
        "harness_version": prompt.version,
        "tasks": n_tasks,
        "prefix_tokens": len(group.prefix),
        "row_tokens_mean": round(sum(len(ids) for ids, _ in group.rows) / len(group.rows), 1),
        "prep_seconds": round(prep_s, 1),
        "lr": lr,
        "bf16": bf16,
        "workdir": workdir,
        **report,
    }
