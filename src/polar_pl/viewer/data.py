"""What the viewer shows, read from disk on each request (a run may still be writing):
runs -> steps -> groups -> sessions from each run's `rollouts.jsonl`; a session's model calls from
the trace store (read-only connection, so a running gateway is never blocked); its trajectory rows
rebuilt with the prefix builder, exactly as training merged them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from polar_pl.gateway.store.records import SessionInfo, TraceRecord
from polar_pl.gateway.store.traces import read_records, read_sessions
from polar_pl.monitor.rollouts import FILE as ROLLOUTS
from polar_pl.monitor.rollouts import read_rollouts
from polar_pl.trajectory import PrefixBuilder


@dataclass(slots=True)
class Run:
    """A run directory (or, with no run given, the whole store as one run without steps)."""

    name: str
    store: Path
    dir: Path | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)

    def steps(self) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for line in self.lines:
            out[int(line.get("step", 0))].append(line)
        return dict(sorted(out.items()))


def find_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Each path that holds a rollouts.jsonl, or the run directories below it (sweeps, outputs/)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / ROLLOUTS).exists():
            found.append(p)
        elif p.is_dir():
            found += sorted({f.parent for f in p.glob(f"**/{ROLLOUTS}")})
    return found


def load_runs(store: str | Path | None, run_paths: Sequence[str | Path]) -> list[Run]:
    runs = []
    for d in find_run_dirs(run_paths):
        own = d / "traces.db"
        runs.append(
            Run(name=d.name, dir=d, store=own if own.exists() else Path(store or own), lines=read_rollouts(d))
        )
    if not runs and store is not None:
        runs.append(Run(name=Path(store).name, store=Path(store), lines=store_lines(store)))
    return runs


def store_lines(store: str | Path) -> list[dict[str, Any]]:
    """Session lines for a store without a run directory: no step, reward unknown."""
    return [
        {
            "step": 0,
            "group_id": s.group_id or "-",
            "rollout_id": s.rollout_id,
            "session_id": s.session_id,
            "task_id": s.task_id,
            "harness": s.harness,
            "status": "deleted" if s.deleted else "registered",
            "reward": None,
            "breaks": {},
        }
        for s in read_sessions(store)
    ]


def step_summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [float(x["reward"]) for x in lines if x.get("reward") is not None]
    breaks: dict[str, int] = defaultdict(int)
    for x in lines:
        for kind, n in (x.get("breaks") or {}).items():
            breaks[kind] += int(n)
    mean = sum(rewards) / len(rewards) if rewards else None
    std = (
        (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
        if mean is not None and len(rewards) > 1
        else None
    )
    return {
        "sessions": len(lines),
        "groups": len({x.get("group_id") for x in lines}),
        "reward_mean": mean,
        "reward_std": std,
        "pass_rate": sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else None,
        "breaks": {k: v for k, v in sorted(breaks.items()) if v},
        "statuses": sorted({str(x.get("status")) for x in lines}),
    }


def by_group(lines: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for x in lines:
        out[str(x.get("group_id"))].append(x)
    return dict(out)


# ---- one session ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Token:
    text: str
    id: int
    sampled: bool
    logprob: float
    version: int


@dataclass(frozen=True, slots=True)
class RowView:
    start: str  # "first", or the BreakKind that started this row
    call_kind: str
    calls: tuple[int, ...]
    tokens: list[Token]
    sampled: int


def session_info(store: Path, session_id: str) -> SessionInfo | None:
    return next((s for s in read_sessions(store) if s.session_id == session_id), None)


def session_records(store: Path, session_id: str) -> list[TraceRecord]:
    return read_records(store, session_id)


@lru_cache(maxsize=4)
def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def decode_each(tokenizer: Any, ids: list[int]) -> list[str]:
    if tokenizer is None:
        return [f"[{i}]" for i in ids]
    return [tokenizer.decode([i]) for i in ids]


def rows_of(records: list[TraceRecord], reward: float, tokenizer: Any) -> list[RowView]:
    """The session's trajectory rows, as the prefix builder merges them in training."""
    built = PrefixBuilder().build(records, reward=reward)
    views = []
    for row in built.rows:
        texts = decode_each(tokenizer, row.input_ids)
        tokens = [
            Token(t, i, bool(m), lp, v)
            for t, i, m, lp, v in zip(
                texts, row.input_ids, row.loss_mask, row.behavior_logprobs, row.policy_version, strict=True
            )
        ]
        views.append(
            RowView(
                str(row.meta.get("start", "first")),
                str(row.meta.get("call_kind", "main")),
                row.call_indices,
                tokens,
                row.num_trainable,
            )
        )
    return views


def request_summary(rec: TraceRecord) -> dict[str, Any]:
    """Messages, tools and limits of a call's normalised (chat) request."""
    req = rec.normalized_request or {}
    chat = req["chat"] if isinstance(req.get("chat"), dict) else req
    msgs = chat["messages"] if isinstance(chat.get("messages"), list) else []
    last_user = next((m for m in reversed(msgs) if isinstance(m, dict) and m.get("role") == "user"), None)
    content = (last_user or {}).get("content", "")
    if isinstance(content, list):
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return {
        "messages": len(msgs),
        "roles": " ".join(str(m.get("role", "?"))[:1] for m in msgs if isinstance(m, dict)),
        "tools": len(chat.get("tools") or []),
        "max_tokens": chat.get("max_tokens") or chat.get("max_completion_tokens"),
        "last_user": str(content)[:300],
    }


def response_text(rec: TraceRecord, tokenizer: Any) -> str:
    if tokenizer is not None and rec.response_ids:
        return tokenizer.decode(rec.response_ids)
    return rec.raw_response[:2000]


def tokenizer_dir(run: Run | None, default: str | None) -> str | None:
    """The run's model directory (its Hydra config), else the default given."""
    if run is not None and run.dir is not None:
        cfg = run.dir / "csv" / "hparams.yaml"  # the resolved config (Hydra's own copy is not)
        if cfg.exists():
            try:
                import yaml

                model_dir = (yaml.safe_load(cfg.read_text()) or {}).get("model_dir")
                if model_dir and (Path(model_dir) / "tokenizer.json").exists():
                    return str(model_dir)
            except (OSError, ValueError, yaml.YAMLError):
                pass
    return default


def rollout_line(run: Run | None, session_id: str) -> dict[str, Any]:
    if run is None:
        return {}
    return next((x for x in run.lines if x.get("session_id") == session_id), {})


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:20000]
