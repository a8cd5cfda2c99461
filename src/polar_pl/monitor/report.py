"""What a run leaves in its directory: `rollouts.jsonl` after every step (RolloutRecorder), and at the
end (RunReport) the plots into `<run_dir>/plots/`, and to W&B the same plots as images and
a table with a sample of trajectories per step (prompt excerpt, answer, reward, masks summary)."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning as L

from polar_pl.monitor.plots import plot_run
from polar_pl.monitor.rollouts import FILE, read_rollouts, session_lines
from polar_pl.rollout.runtime import feed_of

log = logging.getLogger("polar_pl.train")

TABLE_COLUMNS = ["step", "group", "session", "reward", "status", "prompt", "answer", "masks"]


def sample_per_step(lines: list[dict[str, Any]], per_step: int) -> list[dict[str, Any]]:
    """Per step: the best and worst attempts first, then others in log order, `per_step` in all."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for x in lines:
        by_step[int(x.get("step", 0))].append(x)
    out = []
    for step in sorted(by_step):
        xs = by_step[step]
        ranked = sorted(xs, key=lambda x: float(x.get("reward") or 0.0))
        picked = [ranked[-1], ranked[0], *xs] if xs else []
        seen: set[str] = set()
        for x in picked:
            key = str(x.get("rollout_id"))
            if key not in seen and len(seen) < per_step:
                seen.add(key)
                out.append(x)
    return out


def table_rows(lines: list[dict[str, Any]], per_step: int) -> list[list[Any]]:
    rows = []
    for x in sample_per_step(lines, per_step):
        breaks = ", ".join(f"{k} {n}" for k, n in (x.get("breaks") or {}).items() if n) or "none"
        masks = f"{x.get('trainable_tokens', 0)} sampled / {x.get('tokens', 0)} tokens, {x.get('rows', 0)} rows, breaks: {breaks}"
        rows.append(
            [
                x.get("step"),
                x.get("group_id"),
                x.get("session_id"),
                x.get("reward"),
                x.get("status"),
                (x.get("prompt") or "")[:200],
                (x.get("answer") or "")[:500],
                masks,
            ]
        )
    return rows


class RunReport(L.Callback):
    """Writes the plots when training ends and logs them (and the trajectory table) to W&B."""

    def __init__(self, run_dir: str | Path, table_per_step: int = 4) -> None:
        self.run_dir = Path(run_dir)
        self.table_per_step = table_per_step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        for lg in trainer.loggers:
            lg.save()  # the CSV logger buffers its last rows
        try:
            paths = plot_run(self.run_dir)
        except (FileNotFoundError, ValueError) as exc:
            log.warning("no plots: %s", exc)
            return
        self._to_wandb(trainer, paths)
        if paths:
            log.info("plots: %s/{%s}", paths[0].parent, ",".join(p.name for p in paths))
        log.info("trajectories: polar-pl view --run %s  (then open http://127.0.0.1:8765/)", self.run_dir)

    def _to_wandb(self, trainer: L.Trainer, paths: list[Path]) -> None:
        from lightning.pytorch.loggers import WandbLogger

        loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if not loggers:
            return
        rows = table_rows(read_rollouts(self.run_dir), self.table_per_step)
        for lg in loggers:
            for p in paths:
                lg.log_image(key=f"plots/{p.stem}", images=[str(p)])
            if rows:
                lg.log_table(key="trajectories", columns=TABLE_COLUMNS, data=rows)


class RolloutRecorder(L.Callback):
    """Appends the trained batch's attempts to `<run_dir>/rollouts.jsonl` after each step."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / FILE
        self._groups: list[Any] = []
        self._step = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        feed = feed_of(trainer)
        self._groups = list(feed.last_groups) if feed is not None else []  # the batch about to train
        self._step = (feed.batches_done if feed is not None else batch_idx) + 1  # 1-based, as the step line

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._groups or not trainer.is_global_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            for line in session_lines(self._step, self._groups):
                f.write(json.dumps(line, default=str) + "\n")
