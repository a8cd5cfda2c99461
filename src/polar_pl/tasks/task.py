"""The Task record and its parsing from SWE-bench / SWE-Gym style rows.

A row carries the SWE-bench fields (`instance_id`, `repo`, `base_commit`, `problem_statement`,
`test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, optionally the gold `patch`) plus how to set up the
environment: `setup_commands` run in a fresh checkout before the tests, `test_runner` (`unittest`
or `pytest`; for pytest, `test_command` or SWE-bench's `test_cmd`, `[PYTHON -m] pytest ARGS`, names
the interpreter and extra arguments: the evaluator runs pytest itself, one process per test file,
with plugin autoload off, so plugins a project needs go in as `-p NAME`) and where the repository snapshot comes from (`repo_path`: a directory of plain files or a local
git repository that holds `base_commit`). `FAIL_TO_PASS` / `PASS_TO_PASS` may be
JSON-encoded strings, as SWE-bench ships them, or real lists.

A row may name its container image (`image`, or the `image_name` / `docker_image` fields that
SWE-smith, SWE-rebench and R2E-Gym rows carry; see images.py for the SWE-bench and SWE-Gym naming
schemes) and a build context (`image_context`: a directory with a Dockerfile) for when the image
can be neither found nor pulled. A task with an image and no `repo_path` finds its repository in
the image (at the image's WORKDIR, `/testbed` for SWE-bench images).

Answer-scored tasks (the learnable family) have no repository: their reward comes from the agent's
final answer text, checked by the verifier named in `answer_check`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

TestRunner = Literal["unittest", "pytest"]
TEST_RUNNERS: tuple[str, ...] = ("unittest", "pytest")
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")

# SWE-bench fields we keep verbatim in `extra` when present (they do not change evaluation).
_PASSTHROUGH = ("version", "environment_setup_commit", "created_at", "hints_text")
IMAGE_FIELDS = ("image", "image_name", "docker_image")  # ours, SWE-smith / SWE-rebench, R2E-Gym


class TaskFormatError(ValueError):
    """A task row is malformed; the message names the instance and the field."""

    def __init__(self, instance_id: str, field_name: str, problem: str, origin: str = "") -> None:
        where = f" in {origin}" if origin else ""
        super().__init__(f"task {instance_id!r}{where}: field {field_name!r} {problem}")
        self.instance_id = instance_id
        self.field_name = field_name


@dataclass(frozen=True, slots=True)
class AnswerCheck:
    """How an answer-scored task is verified: a named check from `polar_pl.tasks.answer` + params."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Task:
    """One task instance. Patch-scored when it has a repository, answer-scored when `answer_check`."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str = ""
    patch: str = ""  # the reference (gold) fix; empty when unknown
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    setup_commands: tuple[str, ...] = ()
    test_runner: TestRunner = "unittest"
    test_command: str | None = None  # pytest runner: `[PYTHON -m] pytest ARGS` (interpreter, extra args)
    repo_path: str | None = None  # host directory (plain files) or local git repo holding base_commit
    difficulty: str | None = None
    answer_check: AnswerCheck | None = None
    image: str | None = None  # the container image agent and evaluator sandboxes start from
    image_context: str | None = None  # host directory with a Dockerfile that builds `image`
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def scored_by_answer(self) -> bool:
        return self.answer_check is not None

    @property
    def prompt(self) -> str:
        """The text the harness receives as its task."""
        if self.scored_by_answer:
            return self.problem_statement
        return (
            f"You are working in a checkout of the repository {self.repo} (current directory). "
            "A user filed the issue below. Change the source code so that the issue is fixed; "
            "do not modify the tests.\n\n"
            f"<issue>\n{self.problem_statement.strip()}\n</issue>"
        )

    @property
    def test_ids(self) -> tuple[str, ...]:
        return self.fail_to_pass + self.pass_to_pass


def _test_list(raw: Any, instance_id: str, name: str, origin: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else []
        except json.JSONDecodeError as exc:
            raise TaskFormatError(
                instance_id, name, f"is not a JSON list of test ids ({exc})", origin
            ) from None
    if not isinstance(raw, list | tuple) or not all(isinstance(t, str) and t for t in raw):
        raise TaskFormatError(instance_id, name, "must be a list of non-empty test id strings", origin)
    return tuple(raw)


def _str_field(row: Mapping[str, Any], name: str, instance_id: str, origin: str, *, required: bool) -> str:
    value = row.get(name)
    if value is None:
        if required:
            raise TaskFormatError(instance_id, name, "is missing", origin)
        return ""
    if not isinstance(value, str):
        raise TaskFormatError(instance_id, name, f"must be a string, got {type(value).__name__}", origin)
    if required and not value.strip():
        raise TaskFormatError(instance_id, name, "is empty", origin)
    return value


def task_from_row(row: Mapping[str, Any], *, origin: str = "", repo_path: str | None = None) -> Task:
    """Validate one SWE-bench-style row and build a Task; raise TaskFormatError naming the field."""
    raw_id = row.get("instance_id")
    if not isinstance(raw_id, str) or not raw_id.strip():
        raise TaskFormatError(str(raw_id), "instance_id", "is missing or not a non-empty string", origin)
    iid = raw_id
    check = row.get("answer_check")
    answer_check = None
    if check is not None:
        if not isinstance(check, Mapping) or not isinstance(check.get("kind"), str):
            raise TaskFormatError(iid, "answer_check", "must be an object with a string 'kind'", origin)
        answer_check = AnswerCheck(check["kind"], dict(check.get("params") or {}))
    patch_scored = answer_check is None
    runner = row.get("test_runner") or "unittest"
    if runner not in TEST_RUNNERS:
        raise TaskFormatError(
            iid, "test_runner", f"is {runner!r}; allowed: {', '.join(TEST_RUNNERS)}", origin
        )
    difficulty = row.get("difficulty")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise TaskFormatError(
            iid, "difficulty", f"is {difficulty!r}; allowed: {', '.join(DIFFICULTIES)}", origin
        )
    setup = row.get("setup_commands") or []
    if isinstance(setup, str):
        setup = [setup]
    if not isinstance(setup, list | tuple) or not all(isinstance(c, str) for c in setup):
        raise TaskFormatError(iid, "setup_commands", "must be a list of shell command strings", origin)
    f2p = _test_list(row.get("FAIL_TO_PASS", row.get("fail_to_pass")), iid, "FAIL_TO_PASS", origin)
    p2p = _test_list(row.get("PASS_TO_PASS", row.get("pass_to_pass")), iid, "PASS_TO_PASS", origin)
    image, image_context = _image_fields(row, iid, origin)
    if patch_scored and not f2p:
        raise TaskFormatError(iid, "FAIL_TO_PASS", "is empty: nothing would show the fix", origin)
    test_command = row.get("test_command", row.get("test_cmd"))
    if test_command is not None and (not isinstance(test_command, str) or not test_command.strip()):
        raise TaskFormatError(iid, "test_command", "must be a non-empty shell command string", origin)
    row_repo_path = row.get("repo_path")
    if row_repo_path is None and image is not None:
        repo_path = None  # the repository is in the image (repos_dir applies to image-less rows)
    if row_repo_path is not None and not isinstance(row_repo_path, str):
        raise TaskFormatError(iid, "repo_path", "must be a string path", origin)
    return Task(
        instance_id=iid,
        repo=_str_field(row, "repo", iid, origin, required=patch_scored),
        base_commit=_str_field(row, "base_commit", iid, origin, required=patch_scored),
        problem_statement=_str_field(row, "problem_statement", iid, origin, required=True),
        test_patch=_str_field(row, "test_patch", iid, origin, required=False),
        patch=_str_field(row, "patch", iid, origin, required=False),
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        setup_commands=tuple(setup),
        test_runner=cast(TestRunner, runner),  # checked against TEST_RUNNERS above
        test_command=test_command,
        repo_path=row_repo_path or repo_path,
        difficulty=difficulty,
        answer_check=answer_check,
        image=image,
        image_context=image_context,
        extra={k: row[k] for k in _PASSTHROUGH if row.get(k) is not None},
    )


def _image_fields(row: Mapping[str, Any], iid: str, origin: str) -> tuple[str | None, str | None]:
    image = next((row[k] for k in IMAGE_FIELDS if row.get(k) is not None), None)
    name = next((k for k in IMAGE_FIELDS if row.get(k) is not None), "image")
    if image is not None and (not isinstance(image, str) or not image.strip() or " " in image):
        raise TaskFormatError(iid, name, "must be an image reference such as repo/name:tag", origin)
    context = row.get("image_context")
    if context is not None and not isinstance(context, str):
        raise TaskFormatError(iid, "image_context", "must be a directory path holding a Dockerfile", origin)
    if context is not None and image is None:
        raise TaskFormatError(iid, "image_context", "needs an image name to tag the build with", origin)
    return image, context
