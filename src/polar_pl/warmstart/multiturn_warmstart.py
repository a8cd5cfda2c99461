"""Warm start for the multi-turn learning check: the mini agent's note-taking sessions of `case`.

The untrained tiny model does not learn to read the prompt reliably: on the `case` task (capitals
or lowercase, by prompt) its attention is near uniform, and whether GRPO finds the prompt or
collapses onto one case first is decided by the samples (bench/multiturn_learning.py, measured
over seeds). RL fine-tunes pretrained models; this is the tiny model's pretraining for that check.
It is fine-tuned on the sessions `mini_agent.run_notes` holds (system, task, short notes each
answered by an observation restating the task, the answer), rendered through its own chat
template with the loss on assistant tokens, whose answers are words in the case the prompt asks
for with probability `share` per word and in the other case otherwise. The model then reads the
prompt but only partly follows it: GRPO has to raise the share of letters in the asked case,
which only reading the prompt does, since a policy collapsed onto one case scores 0.5.
"""

from __future__ import annotations

import random
from typing import Any

from tokenizers import Tokenizer
from transformers import PreTrainedModel

from polar_pl.harness.mini_agent import NOTES_SYSTEM, observation
from polar_pl.tasks.learnable import learnable_task
from polar_pl.tinymodel.tokenizer import ENDOFTEXT, render_chat
from polar_pl.warmstart.chat_warmstart import labelled, train

WORDS = (
    "the",
    "weather",
    "is",
    "nice",
    "today",
    "my",
    "cat",
    "likes",
    "fish",
    "a",
    "river",
    "runs",
    "north",
    "blue",
    "sky",
    "apple",
    "pie",
    "good",
    "song",
    "big",
    "hill",
)
NOTES = ("ok", "noted", "thinking", "done", "next", "fine")


def session_messages(task: str, notes: list[str], answer: str) -> list[dict[str, str]]:
    """The main conversation `run_notes` builds for `task` with these notes and final answer."""
    messages = [{"role": "system", "content": NOTES_SYSTEM}, {"role": "user", "content": task}]
    for turn, note in enumerate(notes):
        messages.append({"role": "assistant", "content": note})
        messages.append({"role": "user", "content": observation(turn, len(notes), task)})
    return [*messages, {"role": "assistant", "content": answer}]


def case_session(rng: random.Random, share: float, work_turns: int) -> list[dict[str, str]]:
    """A session of a random `case` task whose answer has each word in the asked case w.p. `share`."""
    task = learnable_task("case", rng.randrange(1 << 16), seed=rng.randrange(1, 1 << 30))
    assert task.answer_check is not None  # case tasks always have one
    upper = task.answer_check.kind == "uppercase_fraction"
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 5))]
    answer = " ".join(w.upper() if (rng.random() < share) == upper else w for w in words)
    return session_messages(task.prompt, [rng.choice(NOTES) for _ in range(work_turns)], answer)


def warm_start_multiturn(
    model: PreTrainedModel,
    tok: Tokenizer,
    share: float = 0.85,
    steps: int = 400,
    seed: int = 0,
    work_turns: int = 2,
    count: int = 2000,
) -> dict[str, Any]:
    """Fine-tune `model` in place on `count` generated sessions for exactly `steps` steps of 8
    (build.build_multiturn_model checks `share` before any of this starts)."""
    rng = random.Random(seed)
    examples = [
        labelled(tok.encode(render_chat(case_session(rng, share, work_turns))).ids, tok) for _ in range(count)
    ]
    pad_id = tok.token_to_id(ENDOFTEXT)
    assert pad_id is not None  # the tiny tokenizer always has <|endoftext|>
    report = train(model, examples, 0.0, seed, pad_id, batch_size=8, peak_lr=3e-3, steps=steps)
    return {"share": share, "work_turns": work_turns, "examples": len(examples), **report}
