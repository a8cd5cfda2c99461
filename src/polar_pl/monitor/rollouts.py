"""`rollouts.jsonl` in the run directory (written by `report.RolloutRecorder`): one line per trained attempt, with the step that trained
it, so the viewer can list runs -> steps -> groups -> sessions and the W&B table can sample them.

    {"step": 3, "group_id": "ab12cd-g6", "rollout_id": "ab12cd-g6-r0", "session_id": "...",
     "task_id": "learnable-uppercase-0002", "prompt": "Shout your answer in CAPITALS: ...",
     "harness": "mini", "status": "ok", "reward": 0.42, "eval_status": "unresolved",
     "answer": "...", "calls": 1, "rows": 1, "tokens": 421, "trainable_tokens": 24,
     "breaks": {"compaction": 0, ...}, "timings": {"init": 0.2, "running": 2.9, "postrun": 0.1},
     "error": null}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

FILE = "rollouts.jsonl"
PROMPT_CHARS = 400
ANSWER_CHARS = 2000


def session_lines(step: int, groups: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """One dict per attempt of the batch's groups (datamodule `Group`s)."""
    for g in groups:
        prompt = str(getattr(g.task, "prompt", "") or "")
        for r in g.results:
            yield {
                "step": step,
                "group_id": g.group_id,
                "rollout_id": r.rollout_id,
                "session_id": r.info.session_id,
                "task_id": r.task_id,
                "prompt": prompt[:PROMPT_CHARS],
                "harness": r.info.harness,
                "status": r.status,
                "reward": r.reward,
                "eval_status": r.info.eval_status,
                "answer": (r.info.answer or "")[:ANSWER_CHARS],
                "calls": r.info.calls,
                "rows": len(r.rows),
                "tokens": sum(len(row.input_ids) for row in r.rows),
                "trainable_tokens": sum(row.num_trainable for row in r.rows),
                "breaks": {
                    k.removeprefix("merge/breaks/"): int(v)
                    for k, v in r.info.merge.items()
                    if k.startswith("merge/breaks/")
                },
                "timings": {k: round(v, 3) for k, v in r.timings.items() if k != "submitted"},
                "error": r.error,
            }


def read_rollouts(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's rollout lines (empty when the run wrote none)."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash mid-write
    return out
