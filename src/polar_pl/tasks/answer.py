"""Answer checks and the evaluator for answer-scored tasks (the learnable family).

A check is a pure function (answer text, params) -> reward in [0, 1] that reads the answer: dense
enough that near-random text from an untrained model gets varied, non-zero rewards (so GRPO groups
carry signal), and maximised only by text that does what the prompt asks. The answer is the
harness's final assistant message (`.polar/answer.txt` for the mini harness), passed in by POSTRUN;
nothing runs in the agent's sandbox, so there is nothing there to tamper with.
"""

from __future__ import annotations

import difflib
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from polar_pl.tasks.evaluator import EvalHandle
from polar_pl.tasks.results import EvalResult, EvalStatus
from polar_pl.tasks.task import Task

AnswerCheckFn = Callable[[str, Mapping[str, Any]], float]


def uppercase_fraction(answer: str, params: Mapping[str, Any]) -> float:
    """Share of the answer's letters that are capitals; `min_letters` letters are needed for full credit."""
    letters = [c for c in answer if c.isalpha()]
    if not letters:
        return 0.0
    upper = sum(c.isupper() for c in letters)
    return upper / max(len(letters), int(params.get("min_letters", 1)))


def lowercase_fraction(answer: str, params: Mapping[str, Any]) -> float:
    """Share of the answer's letters that are lowercase; `min_letters` letters are needed for full credit."""
    letters = [c for c in answer if c.isalpha()]
    if not letters:
        return 0.0
    return sum(c.islower() for c in letters) / max(len(letters), int(params.get("min_letters", 1)))


def charset_fraction(answer: str, params: Mapping[str, Any]) -> float:
    """Share of the answer's non-space characters drawn from `params["chars"]`."""
    allowed = set(params["chars"])
    chars = [c for c in answer if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c in allowed for c in chars) / max(len(chars), int(params.get("min_chars", 1)))


def similarity(answer: str, params: Mapping[str, Any]) -> float:
    """Character-level similarity (difflib ratio) of the stripped answer to `params["target"]`."""
    return difflib.SequenceMatcher(None, answer.strip(), str(params["target"]), autojunk=False).ratio()


def file_from_patch(patch: str, path: str) -> str | None:
    """The content of `path` if the patch creates it (the workspace diff against the baseline)."""
    try:
        files = PatchSet(patch)
    except UnidiffParseError:
        return None
    for pf in files:
        if pf.path == path and pf.is_added_file:
            return "".join(line.value for hunk in pf for line in hunk if line.is_added)
    return None


def file_similarity(patch: str, params: Mapping[str, Any]) -> float:
    """Half the case-blind, half the exact similarity of the created file's stripped content to
    `params["target"]` (the right word in the wrong case earns half); 0 without the file."""
    content = file_from_patch(patch, str(params["path"]))
    if content is None:
        return 0.0
    blind = similarity(content.lower(), {"target": str(params["target"]).lower()})
    return 0.5 * blind + 0.5 * similarity(content, params)


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in `text` ("1,469" is 1469; a sign is not read: the tasks' answers
    are never negative, and "183-24" must not read as -24)."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].rstrip(",").replace(",", ""))
    except ValueError:
        return None


def final_integer(answer: str, params: Mapping[str, Any]) -> float:
    """1 when the last number in the answer equals `params["value"]`. Otherwise 0, or with
    `params["partial"]` 0.5 x the share of trailing digits it gets right, over the longer of the
    two numbers ("224" for 234: 1 of 3 digits, 0.17; "1234": 3 of 4, 0.375): a dense signal for a
    model that is rarely exact, and what the low digits of a sum or product depend on; only an exact
    answer passes (reward 1)."""
    want, got = int(params["value"]), last_number(answer)
    if got == want:
        return 1.0
    if not params.get("partial") or got is None or got != int(got):
        return 0.0
    digits, mine = str(want), str(int(got))
    right = next(
        (i for i, (a, b) in enumerate(zip(reversed(digits), reversed(mine), strict=False)) if a != b),
        min(len(digits), len(mine)),
    )
    return 0.5 * right / max(len(digits), len(mine))


def file_integer(patch: str, params: Mapping[str, Any]) -> float:
    """1 when the file the patch creates at `params["path"]` ends with the number `params["value"]`."""
    content = file_from_patch(patch, str(params["path"]))
    return 0.0 if content is None else final_integer(content, params)


CHECKS: dict[str, AnswerCheckFn] = {
    "uppercase_fraction": uppercase_fraction,
    "lowercase_fraction": lowercase_fraction,
    "charset_fraction": charset_fraction,
    "similarity": similarity,
    "final_integer": final_integer,
}
# Checks that read the workspace (the agent's patch) instead of the final answer.
WORKSPACE_CHECKS: dict[str, AnswerCheckFn] = {
    "file_similarity": file_similarity,
    "file_integer": file_integer,
}


def score_answer(task: Task, answer: str | None, patch: str = "") -> float:
    """The task's check applied to the answer (0 for no answer), or to the patch for a workspace check."""
    if task.answer_check is None:
        raise ValueError(f"task {task.instance_id!r} is not answer-scored")
    kind, params = task.answer_check.kind, task.answer_check.params
    if kind in WORKSPACE_CHECKS:
        return float(WORKSPACE_CHECKS[kind](patch, params))
    check = CHECKS.get(kind)
    if check is None:
        raise ValueError(
            f"task {task.instance_id!r}: answer_check.kind={kind!r}; "
            f"allowed: {', '.join([*CHECKS, *WORKSPACE_CHECKS])}"
        )
    return float(check(answer or "", params)) if answer else 0.0


class AnswerEvaluator:
    """Scores answer-scored tasks on the host; the patch is ignored, no sandbox is needed."""

    def __init__(self, sandbox_factory: Any = None, *, success_threshold: float = 0.9) -> None:
        self.success_threshold = success_threshold

    def prewarm(self, task: Task) -> EvalHandle:
        done: Future = Future()
        done.set_result((None, 0.0))
        return EvalHandle(task, done)

    def evaluate(self, handle: EvalHandle, patch: str, answer: str | None = None) -> EvalResult:
        t0, task = time.monotonic(), handle.task
        try:
            reward = score_answer(task, answer, patch)
        except (KeyError, TypeError, ValueError) as exc:  # a bad check config is recorded, not raised
            return EvalResult(task.instance_id, 0.0, "error", f"answer check failed: {exc}")
        assert task.answer_check is not None  # score_answer raised ValueError otherwise
        if not answer and task.answer_check.kind not in WORKSPACE_CHECKS:
            return EvalResult(task.instance_id, 0.0, "no_answer", "the agent gave no final answer")
        status: EvalStatus = "resolved" if reward >= self.success_threshold else "unresolved"
        reason = f"{task.answer_check.kind}={reward:.3f}"
        return EvalResult(task.instance_id, reward, status, reason, duration_s=time.monotonic() - t0)

    def discard(self, handle: EvalHandle) -> None:
        handle.used = True

    def close(self) -> None:
        pass
