"""The run's durable record in its output directory: what makes an interrupted run resumable.

`rollouts.jsonl` is append-only, one line per finished group (every attempt's outcome; accepted
attempts also carry their token rows and conversation). A group is written with one `write` and
fsynced before the run moves on, so a group is either in the log or not: a line torn by a kill is
cut off when the log is opened again, and that group is simply run again. `run_state.json`
(replaced atomically after each group) holds the cursor and the run's fingerprint; the log stays
the source of truth, so a state file one group behind the log loses and duplicates nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

LOG_NAME = "rollouts.jsonl"
STATE_NAME = "run_state.json"  # `datasets` takes a directory with a state.json for save_to_disk output


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and `os.replace`: readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RolloutLog:
    """The group log and state file of one output directory.

    fingerprint: what must not change between a run and its resumption (task ids, group size,
    threshold, merge strategy); opening a log written under another fingerprint raises ValueError.
    resume=False forgets an earlier log in the directory and starts over.
    """

    def __init__(
        self,
        out_dir: str | Path,
        fingerprint: Mapping[str, Any],
        *,
        resume: bool = True,
        setting: str = "sft",
    ) -> None:
        self.dir = Path(out_dir)
        self.setting = setting  # the config section whose output_dir / resume the errors name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / LOG_NAME
        self.state_path = self.dir / STATE_NAME
        self.fingerprint = dict(fingerprint)
        if not resume:
            for p in (self.path, self.state_path):
                p.unlink(missing_ok=True)
        self._check_fingerprint()
        self.groups: dict[int, dict[str, Any]] = {}
        for group in self._read_repairing():
            self.groups.setdefault(group["seq"], group)  # first copy wins (never two, but be safe)

    def _check_fingerprint(self) -> None:
        if not self.state_path.exists():
            return
        saved = json.loads(self.state_path.read_text()).get("fingerprint", {})
        for key, value in self.fingerprint.items():
            if key in saved and saved[key] != value:
                raise ValueError(
                    f"{self.dir} holds a run with {key}={saved[key]!r}, this run has {value!r}: "
                    f"resume with the same settings, or choose another {self.setting}.output_dir "
                    f"(or {self.setting}.resume=false to start it over)"
                )

    def _read_repairing(self) -> Iterator[dict[str, Any]]:
        """Complete lines of the log; a torn last line (a kill mid-write) is truncated away."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                group = json.loads(line)
            except ValueError:
                break
            good += len(line)
            yield group
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())

    @property
    def done(self) -> set[int]:
        return set(self.groups)

    def append(self, group: dict[str, Any]) -> None:
        """Persist one finished group (durable when this returns), then the cursor."""
        if group["seq"] in self.groups:
            return  # already persisted by an earlier run
        line = json.dumps(group, ensure_ascii=False, separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.groups[group["seq"]] = group
        self.write_state()

    def cursor(self) -> dict[str, Any]:
        """The `RolloutService` resume point: every seq below start_seq is done, plus skip_seqs."""
        start = 0
        while start in self.groups:
            start += 1
        return {"start_seq": start, "skip_seqs": sorted(s for s in self.groups if s > start)}

    def write_state(self, **extra: Any) -> None:
        state = {
            "fingerprint": self.fingerprint,
            "cursor": self.cursor(),
            "groups": len(self.groups),
            **extra,
        }
        write_atomic(self.state_path, json.dumps(state, indent=2) + "\n")

    def attempts(self) -> Iterator[dict[str, Any]]:
        """Every logged attempt in seq order, each with its group's seq and task id."""
        for seq in sorted(self.groups):
            yield from self.groups[seq]["attempts"]
