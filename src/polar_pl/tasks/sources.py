"""Task sources: where tasks come from, chosen by the Hydra group `task/` (`_target_` to a class here).

- `SWEBenchTaskSource`: SWE-bench / SWE-Gym rows from local JSONL or parquet through `datasets`
  (the "json" / "parquet" builders; nothing is fetched from the hub).
- `BuiltinTaskSource`: the bug-fix suite shipped in `polar_pl/tasks/builtin/`.
- `LearnableTaskSource`: the answer-scored family a tiny model can learn on CPU (see learnable.py).

Each source also builds the evaluator that fits its tasks: `evaluator` is a partial (Hydra
`_partial_: true`) completed with the sandbox factory the rollout pools use, so evaluation runs in
a fresh sandbox of the configured backend.
"""

from __future__ import annotations

import abc
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from polar_pl.tasks.evaluator import Evaluator, SandboxEvaluator, SandboxFactory
from polar_pl.tasks.harbor import BUILTIN_DIR, find_task_dirs, load_harbor_task
from polar_pl.tasks.harbor_verifier import HarborVerifier
from polar_pl.tasks.task import TEST_RUNNERS, Task, TaskFormatError, task_from_row

EvaluatorPartial = Callable[..., Evaluator]


@runtime_checkable
class TaskSource(Protocol):
    """A finite, ordered list of tasks plus the evaluator that scores them."""

    def tasks(self) -> list[Task]:
        """All tasks, in a stable order (the rollout pools keep a cursor into it)."""

    def make_evaluator(self, sandbox_factory: SandboxFactory | None = None) -> Evaluator:
        """The evaluator for these tasks; `sandbox_factory` makes fresh evaluation sandboxes."""


class _Source(abc.ABC):
    def __init__(
        self,
        evaluator: EvaluatorPartial | None,
        difficulty: Sequence[str] | str | None,
        instance_ids: Sequence[str] | None,
        limit: int | None,
    ) -> None:
        self._evaluator = evaluator or functools.partial(SandboxEvaluator)
        self.difficulty = (difficulty,) if isinstance(difficulty, str) else tuple(difficulty or ())
        self.instance_ids = tuple(instance_ids or ())
        self.limit = limit
        self._cache: list[Task] | None = None

    @abc.abstractmethod
    def _load(self) -> list[Task]:
        """All tasks of this source, before the difficulty / id / limit filters."""

    def tasks(self) -> list[Task]:
        if self._cache is None:
            out = self._load()
            if self.difficulty:
                out = [t for t in out if t.difficulty in self.difficulty]
            if self.instance_ids:
                known = {t.instance_id for t in out}
                missing = [i for i in self.instance_ids if i not in known]
                if missing:
                    raise ValueError(f"task.instance_ids: unknown instance ids {missing}")
                out = [t for t in out if t.instance_id in self.instance_ids]
            self._cache = out[: self.limit] if self.limit else out
        return list(self._cache)

    def make_evaluator(self, sandbox_factory: SandboxFactory | None = None) -> Evaluator:
        return self._evaluator(sandbox_factory=sandbox_factory)


class SWEBenchTaskSource(_Source):
    """SWE-bench-format rows from local files. `repos_dir` holds `owner__name` checkouts (or plain
    snapshot directories) for rows without their own `repo_path`."""

    def __init__(
        self,
        data_files: str | Sequence[str],
        format: str | None = None,
        repos_dir: str | None = None,
        split: str = "train",
        evaluator: EvaluatorPartial | None = None,
        difficulty: Sequence[str] | str | None = None,
        instance_ids: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(evaluator, difficulty, instance_ids, limit)
        self.data_files = [data_files] if isinstance(data_files, str) else list(data_files)
        if not self.data_files:
            raise ValueError("task.data_files is empty: give one or more .jsonl / .parquet files")
        self.format = format or _guess_format(self.data_files[0])
        if self.format not in ("json", "parquet"):
            raise ValueError(f"task.format is {self.format!r}; allowed: json, parquet")
        self.repos_dir = repos_dir
        self.split = split

    def _load(self) -> list[Task]:
        for f in self.data_files:
            if not Path(f).is_file():
                raise FileNotFoundError(f"task.data_files: {f} does not exist")
        rows = _load_rows(self.format, self.data_files, self.split)
        origin = ", ".join(self.data_files)
        tasks, seen = [], set()
        for row in rows:
            repo_path = self._repo_path(row)
            task = task_from_row(row, origin=origin, repo_path=repo_path)
            if task.instance_id in seen:
                raise TaskFormatError(task.instance_id, "instance_id", "is duplicated", origin)
            seen.add(task.instance_id)
            tasks.append(task)
        return tasks

    def _repo_path(self, row: dict[str, Any]) -> str | None:
        if not self.repos_dir or not isinstance(row.get("repo"), str):
            return None
        return str(Path(self.repos_dir) / row["repo"].replace("/", "__"))


def _guess_format(path: str) -> str:
    return "parquet" if path.endswith(".parquet") else "json"


def _load_rows(fmt: str, data_files: list[str], split: str) -> list[dict[str, Any]]:
    """Rows through `datasets`; when its schema inference fails, find the bad row ourselves."""
    import datasets

    try:
        ds = datasets.load_dataset(fmt, data_files={split: data_files}, split=split, keep_in_memory=True)
    except Exception as exc:  # datasets wraps arrow/json errors in several types; we re-diagnose
        if fmt == "json":
            _diagnose_jsonl(data_files)
        raise ValueError(f"task.data_files: could not read {data_files}: {exc}") from exc
    return [dict(r) for r in ds]


def _diagnose_jsonl(data_files: list[str]) -> None:
    """Raise a TaskFormatError naming the line / instance / field that made `datasets` fail."""
    types: dict[str, tuple[type, str]] = {}
    for f in data_files:
        for lineno, line in enumerate(Path(f).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskFormatError(f"<line {lineno}>", "<row>", f"is not valid JSON ({exc})", f) from exc
            if not isinstance(row, dict):
                raise TaskFormatError(f"<line {lineno}>", "<row>", "is not a JSON object", f)
            iid = str(row.get("instance_id", f"<line {lineno}>"))
            task_from_row(row, origin=f"{f}:{lineno}")  # field-level errors first
            for key, value in row.items():
                if value is None:
                    continue
                first = types.setdefault(key, (type(value), iid))
                if first[0] is not type(value):
                    raise TaskFormatError(
                        iid,
                        key,
                        f"is a {type(value).__name__} but {first[1]!r} has a {first[0].__name__}; "
                        "a column must have one type in every row",
                        f"{f}:{lineno}",
                    )


class BuiltinTaskSource(_Source):
    """The shipped bug-fix suite (see `polar_pl.tasks.builtin`); `runner` picks the test runner
    (unittest, or pytest running the same tests by node id)."""

    def __init__(
        self,
        evaluator: EvaluatorPartial | None = None,
        difficulty: Sequence[str] | str | None = None,
        instance_ids: Sequence[str] | None = None,
        limit: int | None = None,
        runner: str = "unittest",
    ) -> None:
        super().__init__(evaluator, difficulty, instance_ids, limit)
        if runner not in TEST_RUNNERS:
            raise ValueError(f"task.runner is {runner!r}; allowed: {', '.join(TEST_RUNNERS)}")
        self.runner = runner

    def _load(self) -> list[Task]:
        from polar_pl.tasks.builtin import load_suite

        return load_suite(self.runner)


class HarborTaskSource(_Source):
    """Harbor task folders under `path` (default: the built-in ones); scored by `HarborVerifier`."""

    def __init__(
        self,
        path: str | None = None,
        evaluator: EvaluatorPartial | None = None,
        difficulty: Sequence[str] | str | None = None,
        instance_ids: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> None:
        if evaluator is None:
            evaluator = functools.partial(HarborVerifier)
        super().__init__(evaluator, difficulty, instance_ids, limit)
        self.path = Path(path) if path else BUILTIN_DIR

    def _load(self) -> list[Task]:
        tasks: list[Task] = []
        seen = set()
        for d in find_task_dirs(self.path):
            task = load_harbor_task(d)
            if task.instance_id in seen:
                raise TaskFormatError(task.instance_id, "task.name", "is duplicated", str(d))
            seen.add(task.instance_id)
            tasks.append(task)
        return tasks
