"""The arith and tools task families: a fixed held-out split that no train split of any seed
contains, the stated number ranges, and checks that read the answer's last number or the file the
agent's patch creates."""

from __future__ import annotations

import hashlib
import subprocess
from collections import Counter

import pytest

from polar_pl.tasks.answer import file_integer, final_integer, last_number, score_answer
from polar_pl.tasks.arith import TEST_SIZE, ArithTaskSource, split_tasks, value


def problems(tasks):
    return [tuple(t.extra["problem"]) for t in tasks]


@pytest.mark.parametrize("family", ["arith", "tools"])
def test_held_out_split_is_fixed_and_never_trained_on(family) -> None:
    test = split_tasks(family, "test")
    assert len(test) == TEST_SIZE == len(set(problems(test)))
    assert problems(test) == problems(split_tasks(family, "test", seed=7))  # the run's seed changes nothing
    assert [t.problem_statement for t in test] == [t.problem_statement for t in split_tasks(family, "test")]
    held = set(problems(test))
    for seed in range(3):
        train = split_tasks(family, "train", 3000, seed=seed)
        assert not held & set(problems(train)), seed
    assert problems(split_tasks(family, "train", 50, seed=1)) != problems(
        split_tasks(family, "train", 50, seed=2)
    )


def test_arith_ranges_and_answers() -> None:
    tasks = split_tasks("arith", "train", 3000)
    ops = Counter(p[1] for p in problems(tasks))
    # (products of two digits are few: those held out are never drawn for training, so "*" is rarer)
    assert set(ops) == {"+", "-", "*"} and min(ops.values()) > 600
    for t, (a, op, b) in zip(tasks, problems(tasks), strict=True):
        if op == "*":
            assert 1 <= max(a, b) <= 99 and 2 <= min(a, b) <= 9
        else:
            assert 10 <= a <= 999 and 10 <= b <= 999
        assert t.answer_check.params["value"] == value((a, op, b)) >= 0
        assert str(a) in t.problem_statement and str(b) in t.problem_statement


@pytest.mark.parametrize(("answer", "expected"), [
    ("159", 159.0), ("183 - 24 = 159.", 159.0), ("The answer is 1,469.", 1469.0), ("183-24", 24.0),
    ("1469.0", 1469.0), ("no number", None), ("5, 6 and then 7", 7.0),
])  # fmt: skip
def test_last_number(answer, expected) -> None:
    assert last_number(answer) == expected


def test_final_integer_scores_only_the_last_number() -> None:
    (task,) = split_tasks("arith", "test", 1)
    right = task.answer_check.params["value"]
    assert score_answer(task, f"It is {right}.") == 1.0
    assert score_answer(task, f"{right}, no wait, {right + 1}") == 0.0
    assert score_answer(task, None) == 0.0 and final_integer("", {"value": 3}) == 0.0


def _patch_creating(path: str, content: str) -> str:
    lines = content.splitlines()
    body = "".join(f"+{ln}\n" for ln in lines)
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


def test_tools_tasks_are_scored_from_the_workspace(tmp_path) -> None:
    tasks = split_tasks("tools", "test", 40)
    compute = next(t for t in tasks if t.extra["problem"][1] == "*")
    read = next(t for t in tasks if t.extra["problem"][1] == "file")
    want = compute.answer_check.params["value"]
    assert score_answer(compute, "whatever it says", _patch_creating("result.txt", f"{want}\n")) == 1.0
    assert (
        score_answer(compute, str(want), _patch_creating("other.txt", str(want))) == 0.0
    )  # saying is not doing
    assert file_integer(_patch_creating("result.txt", "12"), {"path": "result.txt", "value": 13}) == 0.0
    # the read task's setup writes data.txt with the value on the line the prompt names
    subprocess.run(["bash", "-c", read.setup_commands[0]], cwd=tmp_path, check=True)
    a, _, line = read.extra["problem"]
    data = (tmp_path / "data.txt").read_text().splitlines()
    assert (
        len(data) == 9 and data[line - 1] == f"item {line}: {a}" and f"item {line}" in read.problem_statement
    )
    assert read.answer_check.params["value"] == a


# Every reported held-out number was measured on these tasks: a change to how problems are drawn
# must not move them.
HELD_OUT_SHA = {"arith": "c13dae168d669439", "tools": "70e559a8ee9fe0da"}


@pytest.mark.parametrize("family", ["arith", "tools"])
def test_held_out_split_is_the_one_every_result_was_measured_on(family) -> None:
    test = split_tasks(family, "test")
    text = repr([(tuple(t.extra["problem"]), t.problem_statement) for t in test])
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == HELD_OUT_SHA[family]


def test_op_weights_shape_the_train_split_and_leave_the_test_split() -> None:
    weights = {"+": 1.0, "-": 0.2, "*": 1.0}
    ops = Counter(p[1] for p in problems(split_tasks("arith", "train", 3000, op_weights=weights)))
    assert 0.07 < ops["-"] / 3000 < 0.13 and ops["+"] > 1300 and ops["*"] > 1000, ops  # 1/11 subtractions
    assert problems(ArithTaskSource(split="test", op_weights=weights).tasks()) == problems(
        split_tasks("arith", "test")
    )
    held = set(problems(split_tasks("arith", "test")))
    assert not held & set(problems(ArithTaskSource(n_tasks=3000, op_weights=weights).tasks()))
    only_sums = split_tasks("arith", "train", 200, op_weights={"+": 1, "-": 0, "*": 0})
    assert {p[1] for p in problems(only_sums)} == {"+"}
    # no weights: seed 0's train split as it was drawn before weights existed (runs stay comparable)
    assert problems(split_tasks("arith", "train", 4)) == [
        (83, "*", 7),
        (841, "-", 15),
        (698, "-", 13),
        (737, "-", 564),
    ]


def test_ops_keep_both_splits_to_those_operations_and_the_held_out_ids() -> None:
    """The first run's task: addition and multiplication only, on the train split and on the held-out
    set's tasks of those operations, under the ids (and order) they have in the whole set."""
    whole = split_tasks("arith", "test")
    kept = split_tasks("arith", "test", ops=["+", "*"])
    assert [t.instance_id for t in kept] == [t.instance_id for t in whole if t.extra["problem"][1] in "+*"]
    assert [t.problem_statement for t in kept] == [
        t.problem_statement for t in whole if t.extra["problem"][1] in "+*"
    ]
    assert len(kept) == 198 and len(split_tasks("arith", "test", 50, ops=["+", "*"])) == 50
    train = problems(ArithTaskSource(n_tasks=500, ops=["+", "*"]).tasks())
    assert {p[1] for p in train} == {"+", "*"} and not set(train) & set(problems(whole))
    for bad in ([], ["/"]):
        with pytest.raises(ValueError, match="task.ops"):
            ArithTaskSource(ops=bad)
    with pytest.raises(ValueError, match="task.ops"):
        ArithTaskSource(family="tools", ops=["+"])


def test_bad_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match="task.family"):
        ArithTaskSource(family="algebra")
    with pytest.raises(ValueError, match="task.split"):
        ArithTaskSource(split="dev")
    with pytest.raises(ValueError, match="task.n_tasks"):
        split_tasks("arith", "test", TEST_SIZE + 1)
    for bad in (
        {"+": 1, "-": 1},
        {"+": 1, "-": -1, "*": 1},
        {"+": 0, "-": 0, "*": 0},
        {"+": 1, "/": 1, "*": 1},
    ):
        with pytest.raises(ValueError, match="task.op_weights"):
            ArithTaskSource(op_weights=bad)
    with pytest.raises(ValueError, match="task.op_weights"):
        ArithTaskSource(family="tools", op_weights={"+": 1, "-": 1, "*": 1})


@pytest.mark.parametrize(("answer", "reward"), [
    ("234", 1.0), ("so 234.", 1.0), ("224", 0.5 / 3), ("216", 0.0), ("1234", 0.375), ("34", 0.5 * 2 / 3),
    ("no number", 0.0), ("234.5", 0.0),
])  # fmt: skip
def test_partial_credit_counts_trailing_digits_and_only_exact_passes(answer, reward) -> None:
    assert final_integer(answer, {"value": 234, "partial": True}) == pytest.approx(reward)
    assert final_integer(answer, {"value": 234}) == (1.0 if reward == 1.0 else 0.0)


def test_only_train_tasks_give_partial_credit() -> None:
    assert all(t.answer_check.params["partial"] for t in split_tasks("arith", "train", 20, partial=True))
    assert not any(t.answer_check.params.get("partial") for t in split_tasks("arith", "test"))
    assert not ArithTaskSource(split="test", partial=True).tasks()[0].answer_check.params["partial"]
