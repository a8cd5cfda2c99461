"""The learnable task family: answer-scored tasks a tiny random model improves on within ~30 CPU steps.

Default kind `uppercase`: the user asks for a reply in capital letters; the reward is the share of
the answer's letters that are capitals. The untrained tiny model's byte-level BPE vocabulary
(trained on Python sources) holds many all-caps identifiers, so its near-random samples score about
0.1 with a per-sample spread of several hundredths: every GRPO group has signal, and pushing
probability toward capital-letter tokens raises the reward steadily (measured on CPU: group-mean
reward 0.08 in the first steps, 1.0 from step 22 on; plain GRPO, group 16, 32 new tokens, Adam
lr 1e-2; see tests/tasks/test_learnable.py).

Other kinds: `echo` (character similarity to a word the prompt quotes) and `digits` (share of
non-space characters that are digits); harder for a random model, useful once it has learnt
something. `case` alternates `uppercase` tasks (even indices) with their opposite, a reply in
lowercase letters only (odd indices): the untrained model scores ~0.1 and ~0.9, so a policy that
ignores the prompt (collapsed onto capitals, or onto anything) cannot beat the ~0.5 it starts at;
only reading the prompt raises the mean. `file` is scored from the workspace, not the answer: the agent must create
`answer.txt` holding a given word (character similarity of the file's content, 0 without the
file) — a task for real CLIs, which write it with their own tools.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from polar_pl.tasks.sources import EvaluatorPartial, _Source
from polar_pl.tasks.task import AnswerCheck, Task

KINDS = ("uppercase", "echo", "digits", "file", "case")

# The prompts' words; the learning checks' warm starts (polar_pl.warmstart) write their data with them.
TOPICS = (
    "the weather today",
    "your favourite animal",
    "a good name for a cat",
    "what you had for lunch",
    "the capital of France",
    "a colour you like",
    "the best programming language",
    "a famous river",
    "your plans for the weekend",
    "a song you like",
    "the tallest mountain",
    "a fruit you like",
)
UPPER_TEMPLATES = (
    "Tell me about {topic}, and write your whole reply in CAPITAL LETTERS only.",
    "Answer in all caps, no lowercase letters at all: what do you think of {topic}?",
    "I can only read UPPERCASE text. Say something about {topic} using capital letters only.",
    "Shout your answer in CAPITALS: {topic}?",
)
_LOWER_TEMPLATES = (
    "tell me about {topic}, and write your whole reply in lowercase letters only, no capitals.",
    "answer in small letters, not a single capital: what do you think of {topic}?",
    "i can only read lowercase text. say something about {topic} without any capital letter.",
    "whisper your answer in lowercase: {topic}?",
)
ECHO_WORDS = ("banana", "polaris", "gradient", "sandbox", "harness", "reward", "kernel", "lattice")


def file_task_prompt(word: str) -> str:
    return f"Create a file named answer.txt whose whole content is the word {word}."


def learnable_task(kind: str, index: int, seed: int = 0) -> Task:
    """Task `index` of the family `kind`; deterministic in (kind, index, seed)."""
    rng = random.Random(f"{kind}-{seed}-{index}")
    if kind == "uppercase":
        prompt = rng.choice(UPPER_TEMPLATES).format(topic=rng.choice(TOPICS))
        check = AnswerCheck("uppercase_fraction", {"min_letters": 8})
    elif kind == "case" and index % 2 == 0:  # the whole prompt in capitals: the case to copy
        prompt = rng.choice(UPPER_TEMPLATES).format(topic=rng.choice(TOPICS)).upper()
        check = AnswerCheck("uppercase_fraction", {"min_letters": 8})
    elif kind == "case":
        prompt = rng.choice(_LOWER_TEMPLATES).format(topic=rng.choice(TOPICS))
        check = AnswerCheck("lowercase_fraction", {"min_letters": 8})
    elif kind == "echo":
        word = rng.choice(ECHO_WORDS)
        prompt = f"Reply with exactly this word and nothing else: {word}"
        check = AnswerCheck("similarity", {"target": word})
    elif kind == "digits":
        prompt = f"Reply with a number of at least {rng.randint(6, 12)} digits, digits only."
        check = AnswerCheck("charset_fraction", {"chars": "0123456789", "min_chars": 6})
    elif kind == "file":
        word = rng.choice(ECHO_WORDS).upper()
        prompt = file_task_prompt(word)
        check = AnswerCheck("file_similarity", {"path": "answer.txt", "target": word})
    else:
        raise ValueError(f"task.kind is {kind!r}; allowed: {', '.join(KINDS)}")
    return Task(
        instance_id=f"learnable-{kind}-{index:04d}",
        repo="",
        base_commit="",
        problem_statement=prompt,
        difficulty="easy",
        answer_check=check,
    )


class LearnableTaskSource(_Source):
    """`n_tasks` answer-scored tasks of one kind, scored by `AnswerEvaluator` (no sandbox)."""

    def __init__(
        self,
        kind: str = "uppercase",
        n_tasks: int = 16,
        seed: int = 0,
        evaluator: EvaluatorPartial | None = None,
        difficulty: Sequence[str] | str | None = None,
        instance_ids: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"task.kind is {kind!r}; allowed: {', '.join(KINDS)}")
        if n_tasks < 1:
            raise ValueError(f"task.n_tasks must be >= 1, got {n_tasks}")
        if evaluator is None:
            from polar_pl.tasks.answer import AnswerEvaluator

            evaluator = AnswerEvaluator
        super().__init__(evaluator, difficulty, instance_ids, limit)
        self.kind, self.n_tasks, self.seed = kind, n_tasks, seed

    def _load(self) -> list[Task]:
        return [learnable_task(self.kind, i, self.seed) for i in range(self.n_tasks)]
