"""Offline SFT data generation: rollouts with a fixed engine, every attempt evaluated, the verified
ones kept and exported.

The parts come from the same Hydra groups as training (`rollout.build.build_runtime`: engine,
sandbox, harness, task source and evaluator, merge builder, the rollout settings of `datamodule:`);
the rollouts run in the same `RolloutService` and `HarnessRolloutStages` the trainer uses, so a
trajectory here is exactly what GRPO would have trained on. Nothing updates the weights.

Each finished group is written to the output directory's log (`log.py`) before the next one is
taken, so a run stopped at any point (Ctrl-C, a kill, `sft.max_groups`) resumes where it stopped
when the same command is run again: groups in the log are skipped, the rest are run.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from polar_pl.gateway.store.records import TraceRecord
from polar_pl.monitor.progress import LiveProgress
from polar_pl.rollout.pools import OK, RolloutResult
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.rollout.service import Group, RolloutService
from polar_pl.sft.conversation import conversation
from polar_pl.sft.export import export
from polar_pl.sft.log import RolloutLog

GroupCallback = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class SFTOptions:
    """The `sft:` section of conf/sft.yaml.

    output_dir: the run's directory (log, state, trace store, exported dataset); the same
        directory resumes the run. threshold: an attempt is accepted when its status is ok and its
        reward >= threshold. num_groups: groups in the whole run (null: one per task; each group is
        datamodule.group_size attempts at one task). max_groups: stop this invocation after this
        many new groups (the rest is done by the next one). resume: false starts the directory over.
        tokenizer: the served model's tokenizer (reads the sampled turns back for the chat form).
        group_timeout_s: give up when no group finishes for this long (null: wait).
    """

    output_dir: str
    threshold: float = 1.0
    num_groups: int | None = None
    max_groups: int | None = None
    resume: bool = True
    tokenizer: str | None = None
    group_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for key in ("num_groups", "max_groups"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"sft.{key}={value}: must be a positive number of groups or null")
        if self.tokenizer is None:
            raise ValueError("sft.tokenizer is null: give the served model's tokenizer directory")


def fingerprint(
    tasks: list[Any], group_size: int, threshold: float, merge: str, harness: str
) -> dict[str, Any]:
    ids = "\n".join(str(getattr(t, "instance_id", t)) for t in tasks)
    return {
        "tasks": f"{len(tasks)}:{hashlib.sha256(ids.encode()).hexdigest()[:16]}",
        "group_size": group_size,
        "threshold": threshold,
        "merge": merge,
        "harness": harness,
    }


def verdict(result: RolloutResult, threshold: float) -> str:
    """Why an attempt is kept or not: accepted | failed | timeout | infra_failure | no_rows |
    below_threshold."""
    if result.status != OK:
        return result.status
    if not result.rows:
        return "no_rows"
    return "accepted" if result.reward >= threshold else "below_threshold"


def attempt_record(
    result: RolloutResult,
    threshold: float,
    read_records: Callable[[str], list[TraceRecord]],
    tokenizer: Any,
) -> dict[str, Any]:
    """One attempt as logged: its outcome always; token rows and the conversation when accepted."""
    reason = verdict(result, threshold)
    out: dict[str, Any] = {
        "rollout_id": result.rollout_id,
        "task_id": result.task_id,
        "status": result.status,
        "reward": result.reward,
        "reason": reason,
        "error": result.error,
        "info": {k: v for k, v in result.info.as_dict().items() if k != "answer"},
    }
    if reason != "accepted":
        return out
    try:
        records: dict[str, list[TraceRecord]] = {}
        rows = []
        for row in result.rows:
            if row.session_id not in records:
                records[row.session_id] = read_records(row.session_id)
            rows.append(
                {
                    "session_id": row.session_id,
                    # rows hold packed arrays (read from the store as int32): JSON wants Python numbers
                    "input_ids": np.asarray(row.input_ids).tolist(),
                    "loss_mask": np.asarray(row.loss_mask).tolist(),
                    "call_indices": np.asarray(row.call_indices).tolist(),
                    "call_kind": row.meta.get("call_kind", "main"),
                    "chain_start": str(row.meta.get("start", "")),
                }
            )
        chat = conversation(tokenizer, last_main_call([r for rs in records.values() for r in rs]))
    except ValueError as exc:  # no usable main-line call, or a record that cannot be read back
        return {**out, "reason": "unreadable", "error": f"{type(exc).__name__}: {exc}"}
    return {**out, "rows": rows, "chat": chat}


def last_main_call(records: list[TraceRecord]) -> TraceRecord:
    """The trajectory's last main-line call that sampled something: its request holds the whole
    conversation so far (after a compaction, what the harness kept of it)."""
    main = [r for r in records if r.call_kind == "main" and r.status == "ok" and r.response_ids]
    if not main:
        raise ValueError("no main-line call with a sampled response")
    return max(main, key=lambda r: r.call_index)


def group_record(group: Group, threshold: float, read_records, tokenizer) -> dict[str, Any]:
    return {
        "seq": group.seq,
        "group_id": group.group_id,
        "task_id": str(getattr(group.task, "instance_id", group.task)),
        "missing": list(group.missing),
        "attempts": [attempt_record(r, threshold, read_records, tokenizer) for r in group.results],
    }


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def resolved_config_yaml(cfg: DictConfig) -> str:
    """The run's configuration for the card, without Hydra's own node (present when composed)."""
    cfg = OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])
    try:
        return OmegaConf.to_yaml(cfg, resolve=True)
    except Exception:
        return OmegaConf.to_yaml(cfg)


def generate(
    cfg: DictConfig,
    *,
    on_group: GroupCallback | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run (or resume) the SFT generation described by `cfg`, export the dataset; return the stats.

    on_group: called with each group's log record right after it is persisted (tests interrupt
    the run from here).
    """
    from polar_pl.rollout.build import build_runtime  # torch is imported only when a run starts

    opts = SFTOptions(**OmegaConf.to_container(cfg.sft, resolve=True))  # type: ignore[arg-type]  # omegaconf: a DictConfig node gives a dict
    out_dir = Path(opts.output_dir).resolve()
    console = console or Console()
    runtime = build_runtime(cfg)
    tasks = list(runtime.tasks)
    try:
        num_groups = opts.num_groups or len(tasks)
        fp = fingerprint(
            tasks, runtime.group_size, opts.threshold, runtime.builder.name, runtime.harness.name
        )
        log = RolloutLog(out_dir, fp, resume=opts.resume)
        todo = [s for s in range(num_groups) if s not in log.done][: opts.max_groups]
        if log.done:
            console.print(f"resuming {out_dir}: {len(log.done)} of {num_groups} groups already done")
        if todo:
            _run_groups(runtime, log, todo, opts, num_groups, on_group, console)
    finally:
        runtime.close()  # rollouts, engine, then the evaluator and the sandbox hosts
    return export(log, out_dir, num_groups=num_groups, config_yaml=resolved_config_yaml(cfg))


def _run_groups(
    runtime: RolloutRuntime,
    log: RolloutLog,
    todo: list[int],
    opts: SFTOptions,
    num_groups: int,
    on_group: GroupCallback | None,
    console: Console,
) -> None:
    """The groups of `todo` in a service of this process on the runtime's gateway (the log's cursor
    is the service's: groups already logged are skipped)."""
    assert opts.tokenizer is not None  # SFTOptions refuses None
    tokenizer = _load_tokenizer(opts.tokenizer)
    gateway = runtime.start().gateway  # engine and gateway
    if gateway is None:
        raise ValueError("sft: the rollouts run in this process (rollout=local): it reads their traces")
    setup = runtime.rollout_setup()
    service = RolloutService(
        setup.stages(gateway), setup.tasks, **setup.service_kwargs(), limit=todo[-1] + 1, **log.cursor()
    ).start()
    live = LiveProgress(service.metrics, title="sft rollouts", console=console) if runtime.progress else None
    try:
        with live or contextlib.nullcontext():
            for _ in todo:
                (group,) = service.next_groups(1, timeout=opts.group_timeout_s)
                record = group_record(group, opts.threshold, gateway.records, tokenizer)
                log.append(record)
                console.print(_progress_line(log, record, num_groups), markup=False, highlight=False)
                if on_group is not None:
                    on_group(record)
    finally:
        service.stop()


def _progress_line(log: RolloutLog, record: dict[str, Any], num_groups: int) -> str:
    attempts = list(log.attempts())
    accepted = sum(a["reason"] == "accepted" for a in attempts)
    here = sum(a["reason"] == "accepted" for a in record["attempts"])
    rate = accepted / len(attempts) if attempts else 0.0
    return (
        f"group {len(log.done)}/{num_groups} {record['task_id']}: {here}/{len(record['attempts'])} accepted"
        f" · total {accepted}/{len(attempts)} ({rate:.0%})"
    )
