"""Export of the accepted attempts with `datasets`: chat and token forms, stats, dataset card.

Files in the output directory (each form as parquet and JSONL; `rollout_id` links the two):

- `chat.{parquet,jsonl}`: one conversation per accepted trajectory, `messages` and `tools` as TRL's
  SFTTrainer reads them (conversation.py), plus task, reward and turn counts. Messages and tools
  are `datasets.Json` values, so tool schemas and arguments of different shapes survive the round
  trip unchanged.
- `tokens.{parquet,jsonl}`: one example per row of the chosen merge strategy (a trajectory is
  several rows where its chain broke, plus its side calls), `input_ids` and `loss_mask` exactly as
  the builder made them from the trace store (1 on sampled tokens only). For TRL, rename
  `loss_mask` to `assistant_masks` and train with `assistant_only_loss=True`.
- `stats.json` and `README.md` (the dataset card: stats and the run's resolved configuration).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from polar_pl.rollout.pools import INFRA_FAILURE
from polar_pl.sft.conversation import turn_counts
from polar_pl.sft.log import RolloutLog, write_atomic

BREAK_PREFIX = "merge/breaks/"


def _features():
    from datasets import Features, Json, List, Value

    common = {
        "id": Value("string"),
        "task_id": Value("string"),
        "rollout_id": Value("string"),
        "group_seq": Value("int64"),
        "reward": Value("float64"),
    }
    chat = Features(
        {
            **common,
            "messages": List(Json()),
            "tools": List(Json()),
            "num_turns": Value("int64"),
            "num_assistant_turns": Value("int64"),
        }
    )
    tokens = Features(
        {
            **common,
            "call_kind": Value("string"),
            "session_id": Value("string"),
            "chain_start": Value("string"),
            "call_indices": List(Value("int64")),
            "input_ids": List(Value("int32")),
            "loss_mask": List(Value("int8")),
            "num_tokens": Value("int64"),
            "num_trainable": Value("int64"),
        }
    )
    return chat, tokens


def examples(log: RolloutLog) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(chat rows, token rows) of every accepted attempt, in group order."""
    chat, tokens = [], []
    for seq in sorted(log.groups):
        for a in log.groups[seq]["attempts"]:
            if a["reason"] != "accepted":
                continue
            common = {
                "task_id": a["task_id"],
                "rollout_id": a["rollout_id"],
                "group_seq": seq,
                "reward": float(a["reward"]),
            }
            turns, assistant = turn_counts(a["chat"]["messages"])
            chat.append(
                {
                    "id": a["rollout_id"],
                    **common,
                    **a["chat"],
                    "num_turns": turns,
                    "num_assistant_turns": assistant,
                }
            )
            for i, row in enumerate(a["rows"]):
                tokens.append(
                    {
                        "id": f"{a['rollout_id']}/{i}",
                        **common,
                        "call_kind": row["call_kind"],
                        "session_id": row["session_id"],
                        "chain_start": row["chain_start"],
                        "call_indices": row["call_indices"],
                        "input_ids": row["input_ids"],
                        "loss_mask": row["loss_mask"],
                        "num_tokens": len(row["input_ids"]),
                        "num_trainable": sum(row["loss_mask"]),
                    }
                )
    return chat, tokens


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def compute_stats(
    log: RolloutLog, chat: list[dict[str, Any]], tokens: list[dict[str, Any]], num_groups: int
) -> dict[str, Any]:
    """Attempts, acceptance, turns per trajectory, tokens and chain breaks (merge stats)."""
    every = list(log.attempts())
    # infrastructure failures are not the model's attempts: counted apart, out of the rates
    infra = Counter(a["info"].get("infra_kind", "unknown") for a in every if a["status"] == INFRA_FAILURE)
    attempts = [a for a in every if a["status"] != INFRA_FAILURE]
    accepted = [a for a in attempts if a["reason"] == "accepted"]
    breaks_accepted: Counter[str] = Counter()
    breaks_all: Counter[str] = Counter()
    for a in attempts:
        merge = a["info"].get("merge", {})
        for key, value in merge.items():
            if key.startswith(BREAK_PREFIX):
                kind = key.removeprefix(BREAK_PREFIX)
                breaks_all[kind] += int(value)
                if a["reason"] == "accepted":
                    breaks_accepted[kind] += int(value)
    return {
        "groups_done": len(log.groups),
        "groups_total": num_groups,
        "complete": len(log.groups) >= num_groups,
        "attempts": len(attempts),
        "infra_failures": dict(sorted(infra.items())),
        "accepted": len(accepted),
        "acceptance_rate": len(accepted) / len(attempts) if attempts else 0.0,
        "rejected": dict(sorted(Counter(a["reason"] for a in attempts if a["reason"] != "accepted").items())),
        "tasks_solved": len({a["task_id"] for a in accepted}),
        "trajectories": len(chat),
        "token_rows": len(tokens),
        "mean_turns": _mean([c["num_turns"] for c in chat]),
        "mean_assistant_turns": _mean([c["num_assistant_turns"] for c in chat]),
        "mean_calls": _mean([a["info"].get("calls", 0) for a in accepted]),
        "mean_reward": _mean([a["reward"] for a in attempts]),
        "tokens": sum(t["num_tokens"] for t in tokens),
        "trainable_tokens": sum(t["num_trainable"] for t in tokens),
        "breaks": dict(sorted(breaks_accepted.items())),
        "breaks_all_attempts": dict(sorted(breaks_all.items())),
    }


def export(log: RolloutLog, out_dir: str | Path, *, num_groups: int, config_yaml: str) -> dict[str, Any]:
    """Write both forms (parquet + JSONL), stats.json and README.md; return the stats."""
    from datasets import Dataset

    out = Path(out_dir)
    chat_rows, token_rows = examples(log)
    chat_features, token_features = _features()
    for name, rows, features in (("chat", chat_rows, chat_features), ("tokens", token_rows, token_features)):
        # columns from the features (not from the rows): an empty export still has its schema
        ds = Dataset.from_dict({k: [r[k] for r in rows] for k in features}, features=features)
        ds.to_parquet(str(out / f"{name}.parquet"))
        ds.to_json(str(out / f"{name}.jsonl"), lines=True, force_ascii=False)
    stats = compute_stats(log, chat_rows, token_rows, num_groups)
    write_atomic(out / "stats.json", json.dumps(stats, indent=2) + "\n")
    write_atomic(out / "README.md", card(stats, config_yaml))
    return stats


def card(stats: dict[str, Any], config_yaml: str) -> str:
    """The dataset card: loading instructions, the stats table, the resolved configuration."""
    rows = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in stats.items())
    return f"""---
configs:
- config_name: chat
  data_files: chat.parquet
  default: true
- config_name: tokens
  data_files: tokens.parquet
tags:
- polar_pl
- sft
- agent-trajectories
---

# SFT trajectories (polar_pl)

Agent rollouts through the polar_pl gateway with a fixed engine; every attempt was evaluated and
only the verified ones (status ok, reward at or above the threshold) are kept.

- `chat`: one conversation per accepted trajectory (its last main-line call's request plus the
  sampled answer), `messages` and `tools` in the form TRL's `SFTTrainer` reads (tool calls with
  object arguments, tool results as `tool` messages).
- `tokens`: one example per row of the merge strategy (`rollout_id` links it to its trajectory),
  `input_ids` as the engine saw and sampled them, `loss_mask` 1 exactly on sampled tokens (for
  TRL: rename to `assistant_masks`, `assistant_only_loss=True`).

```python
from datasets import load_dataset
chat = load_dataset("parquet", data_files="chat.parquet", split="train")
tokens = load_dataset("json", data_files="tokens.jsonl", split="train")
```

## Stats

| stat | value |
|---|---|
{rows}

`rejected` counts attempts by reason (below_threshold, timeout, failed, no_rows, unreadable);
`infra_failures` counts, by kind, attempts the infrastructure lost (sandbox start, image, exec,
copy, host): they are not in `attempts`, the acceptance rate or the mean reward;
turns are counted in each trajectory's chat conversation (the system prompt is not a turn);
`breaks` are the merge strategy's chain breaks in the accepted attempts.

## Configuration

```yaml
{config_yaml.rstrip()}
```
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()) or "none"
    return str(v)
