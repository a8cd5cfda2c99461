"""Arithmetic tasks with a held-out split: what a real instruct model is trained and evaluated on.

Two families, each with a generated `train` split and a fixed `test` split that training never sees:

- `arith`: a question in words with an exact integer answer ("What is 183 minus 24?"): addition and
  subtraction of 2-3 digit numbers, multiplication of a 1-2 digit number by a digit (2-9, either
  order: "36 times 6", "Multiply 7 by 48").
  Scored from the final answer: the last number in it must equal the result (`final_integer`), so
  "183 - 24 = 159" and "159" both count and a wrong sum after a right one does not.
- `tools`: a task a coding agent must solve with a tool: compute a product of two 3-4 digit numbers
  with a shell command, or read a value from a file the task puts in the workspace, and write the
  result to `result.txt`. Scored from the workspace (the file the agent's patch creates), not from
  what the agent says (`file_integer`).

The test split is generated from a fixed seed, whatever the run's seed; the train split is drawn
from the run's seed and skips every problem that is in the test split, so no held-out problem is
ever trained on. `split=test` always gives the same tasks in the same order.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping, Sequence

from polar_pl.tasks.sources import EvaluatorPartial, _Source
from polar_pl.tasks.task import AnswerCheck, Task

FAMILIES = ("arith", "tools")
SPLITS = ("train", "test")
TEST_SEED = "held-out-v1"  # changing it changes every reported held-out number: don't
TEST_SIZE = 300
RESULT_FILE = "result.txt"

Problem = tuple[int, str, int]  # (a, op, b)

_WORDS: dict[str, tuple[str, ...]] = {
    "+": (
        "What is {a} plus {b}?",
        "What is the sum of {a} and {b}?",
        "Add {a} and {b}.",
        "How much is {a} plus {b}?",
    ),
    "-": (
        "What is {a} minus {b}?",
        "Subtract {b} from {a}.",
        "What is {a} take away {b}?",
        "How much is {a} minus {b}?",
    ),
    "*": (
        "What is {a} times {b}?",
        "Multiply {a} by {b}.",
        "What is the product of {a} and {b}?",
        "How much is {a} times {b}?",
    ),
}
_OPS = ("+", "-", "*")


def value(problem: Problem) -> int:
    a, op, b = problem
    return a + b if op == "+" else a - b if op == "-" else a * b


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def arith_problem(rng: random.Random, op_weights: Sequence[float] | None = None) -> Problem:
    """Addition / subtraction of 2-3 digit numbers (never negative), or a 1-2 digit number times a
    digit from 2 to 9, in either order. op_weights: how often each of + - * is drawn (None: alike,
    the draw the held-out split was made with)."""
    op = rng.choice(_OPS) if op_weights is None else rng.choices(_OPS, op_weights)[0]
    if op == "*":
        a, b = rng.choice((rng.randint(2, 9), rng.randint(10, 99))), rng.randint(2, 9)
        return (a, op, b) if rng.random() < 0.5 else (b, op, a)
    a, b = _number(rng, rng.choice((2, 3))), _number(rng, rng.choice((2, 3)))
    if op == "-" and b > a:
        a, b = b, a
    return a, op, b


def tools_problem(rng: random.Random) -> Problem:
    """A product too large to do in one's head (3-4 digits by 3-4 digits), or ("file", value)."""
    if rng.random() < 0.5:
        return _number(rng, rng.choice((3, 4))), "*", _number(rng, rng.choice((3, 4)))
    return rng.randint(10_000, 99_999), "file", rng.randint(2, 9)


def arith_task(problem: Problem, rng: random.Random, instance_id: str, partial: bool = False) -> Task:
    a, op, b = problem
    prompt = rng.choice(_WORDS[op]).format(a=a, b=b)
    check = AnswerCheck("final_integer", {"value": value(problem), "partial": partial})
    return Task(
        instance_id=instance_id,
        repo="",
        base_commit="",
        problem_statement=prompt,
        difficulty="easy",
        answer_check=check,
        extra={"problem": problem},
    )


def tools_task(problem: Problem, rng: random.Random, instance_id: str, partial: bool = False) -> Task:
    a, op, b = problem
    setup: tuple[str, ...]
    lines: list[str] = []
    if op == "*":
        prompt = f"Use a shell command to compute {a} times {b}, and write the result to {RESULT_FILE}."
        expected, setup = a * b, ()
    else:  # the value sits on line b of data.txt, among other lines
        lines = [f"item {i}: {rng.randint(10_000, 99_999)}" for i in range(1, 10)]
        lines[b - 1] = f"item {b}: {a}"
        prompt = f"Read the file data.txt and write the number of item {b} to {RESULT_FILE}."
        expected, setup = a, ("printf '%s\\n' " + " ".join(f"'{line}'" for line in lines) + " > data.txt",)
    return Task(
        instance_id=instance_id,
        repo="",
        base_commit="",
        problem_statement=prompt,
        difficulty="easy",
        setup_commands=setup,
        extra={"problem": problem, "lines": lines},
        answer_check=AnswerCheck(
            "file_integer", {"path": RESULT_FILE, "value": expected, "partial": partial}
        ),
    )


_MAKERS: dict[str, tuple[Callable[[random.Random], Problem], Callable[..., Task]]] = {
    "arith": (arith_problem, arith_task),
    "tools": (tools_problem, tools_task),
}


def held_out(family: str) -> list[tuple[Problem, random.Random]]:
    """The family's test problems (distinct), each with the rng that words it."""
    make, _ = _MAKERS[family]
    rng = random.Random(f"{family}-{TEST_SEED}")
    out: dict[Problem, random.Random] = {}
    while len(out) < TEST_SIZE:
        problem = make(rng)
        out.setdefault(problem, random.Random(rng.random()))
    return list(out.items())


def split_tasks(
    family: str,
    split: str,
    n_tasks: int | None = None,
    seed: int = 0,
    partial: bool = False,
    op_weights: Mapping[str, float] | None = None,
    ops: Sequence[str] | None = None,
) -> list[Task]:
    """`n_tasks` tasks of `split` (test: the first n of the fixed held-out set, all by default).
    partial: train tasks score near misses (`final_integer`'s partial credit); test tasks never do.
    op_weights: arith train tasks draw + - * this often (a curriculum; the test split is fixed).
    ops: arith tasks of these operations only, in both splits (the test split: the held-out set's
    tasks of those operations, in its order and under their ids in the whole set)."""
    if family not in FAMILIES:
        raise ValueError(f"task.family is {family!r}; allowed: {', '.join(FAMILIES)}")
    if split not in SPLITS:
        raise ValueError(f"task.split is {split!r}; allowed: {', '.join(SPLITS)}")
    if split == "test" and (n_tasks or 0) > TEST_SIZE:
        raise ValueError(f"task.n_tasks={n_tasks}: the test split has {TEST_SIZE} tasks")
    weights = _op_weights(family, op_weights)
    kept = _ops(family, ops)
    make, build = _MAKERS[family]
    test = held_out(family)
    if split == "test":
        chosen = [(i, p, r) for i, (p, r) in enumerate(test) if kept is None or p[1] in kept]
        return [build(p, r, f"{family}-test-{i:04d}") for i, p, r in chosen[: n_tasks or TEST_SIZE]]
    excluded = {p for p, _ in test}
    if weights is not None:  # arith's (checked above)
        make = functools.partial(arith_problem, op_weights=weights)
    rng = random.Random(f"{family}-train-{seed}")
    tasks: list[Task] = []
    while len(tasks) < (n_tasks or 1000):
        problem = make(rng)
        if problem not in excluded and (kept is None or problem[1] in kept):
            iid = f"{family}-train-{seed}-{len(tasks):05d}"
            tasks.append(build(problem, random.Random(rng.random()), iid, partial=partial))
    return tasks


def _op_weights(family: str, op_weights: Mapping[str, float] | None) -> list[float] | None:
    if op_weights is None:
        return None
    weights = dict(op_weights)
    valid = family == "arith" and set(weights) == set(_OPS) and min(weights.values()) >= 0
    if not valid or not any(weights.values()):
        raise ValueError(
            f"task.op_weights is {weights}: arith only, one weight >= 0 for each of "
            f"{', '.join(repr(op) for op in _OPS)}, not all 0"
        )
    return [float(weights[op]) for op in _OPS]


def _ops(family: str, ops: Sequence[str] | None) -> frozenset[str] | None:
    if ops is None:
        return None
    if family != "arith" or not ops or not set(ops) <= set(_OPS):
        raise ValueError(
            f"task.ops is {list(ops)}: arith only, a non-empty list of {', '.join(repr(op) for op in _OPS)}"
        )
    return frozenset(ops)


class ArithTaskSource(_Source):
    """Tasks of one family and split, scored by `AnswerEvaluator` (answer or workspace, no sandbox).

    n_tasks: train: how many to draw (default 1000); test: the first n of the held-out set (null:
    all of it, 300). partial: train tasks give partial credit for a near miss (the trailing
    digits right); what passes, and every test task, is exact. op_weights: {"+": w, "-": w, "*": w},
    how often train tasks of each operation are drawn (null: alike; the test split never changes).
    ops: only tasks of these operations, in both splits (null: all three)."""

    def __init__(
        self,
        family: str = "arith",
        split: str = "train",
        n_tasks: int | None = None,
        seed: int = 0,
        evaluator: EvaluatorPartial | None = None,
        instance_ids: Sequence[str] | None = None,
        limit: int | None = None,
        partial: bool = False,
        op_weights: Mapping[str, float] | None = None,
        ops: Sequence[str] | None = None,
    ) -> None:
        if family not in FAMILIES:
            raise ValueError(f"task.family is {family!r}; allowed: {', '.join(FAMILIES)}")
        if split not in SPLITS:
            raise ValueError(f"task.split is {split!r}; allowed: {', '.join(SPLITS)}")
        if n_tasks is not None and n_tasks < 1:
            raise ValueError(f"task.n_tasks must be >= 1 or null, got {n_tasks}")
        _op_weights(family, op_weights)  # a bad setting is named before anything runs
        _ops(family, ops)
        if evaluator is None:
            from polar_pl.tasks.answer import AnswerEvaluator

            evaluator = AnswerEvaluator
        super().__init__(evaluator, None, instance_ids, limit)
        self.family, self.split, self.n_tasks, self.seed, self.partial = family, split, n_tasks, seed, partial
        self.op_weights, self.ops = op_weights, ops

    def _load(self) -> list[Task]:
        return split_tasks(
            self.family, self.split, self.n_tasks, self.seed, self.partial, self.op_weights, self.ops
        )
