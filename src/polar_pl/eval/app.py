"""What `polar-pl eval` does with a composed config (conf/eval.yaml): the model (a folder, or a
checkpoint turned into one) behind the configured engine, the harness, sandbox, task split and
evaluator from their groups, `run.run_eval`, then the report (and the comparison with an earlier
evaluation) printed and written; W&B on request."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf, open_dict

from polar_pl.eval.report import EvalReport, compare, load_report
from polar_pl.eval.run import EvalSpec, run_eval

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig, on_group: Callable[[dict[str, Any]], None] | None = None) -> EvalReport:
    """Run (or resume) the evaluation `cfg` describes; on_group: called with each finished task's
    log record (tests interrupt the run from here)."""
    from polar_pl.monitor.noise import quiet
    from polar_pl.preflight import preflight

    quiet()
    preflight(cfg)  # the same sessions as training: a harness that cannot run stops here, in one line
    # torch and Lightning load after the check
    from polar_pl.rollout.build import build_runtime, ensure_pretrained_model

    opts = cfg.eval
    out = Path(opts.output_dir).resolve()
    spec = EvalSpec(
        n=int(opts.n),
        ks=tuple(int(k) for k in opts.ks if k <= opts.n),
        threshold=float(opts.threshold),
        group_timeout_s=opts.group_timeout_s,
    )
    if cfg.get("pretrained"):
        ensure_pretrained_model(cfg)
    with open_dict(cfg):
        if opts.ckpt_path:
            from polar_pl.module.export import hf_from_checkpoint

            cfg.model_dir = str(hf_from_checkpoint(opts.ckpt_path, cfg.model_dir, out / "model"))
        if "split" in cfg.task:
            cfg.task.split = opts.split
    runtime = build_runtime(cfg)  # harness, sandbox, task split, evaluator, merge, engine of their groups
    tasks = runtime.tasks[: opts.limit] if opts.limit else runtime.tasks
    try:
        runtime.engine.start()
        report = run_eval(
            runtime, tasks, spec, out, label=str(opts.label), resume=bool(opts.resume), on_group=on_group
        )
    finally:
        runtime.close()  # the engine, the evaluator, the sandbox hosts
    print(report.table(), flush=True)
    if opts.compare:
        comparison = compare(load_report(Path(opts.compare)), report)
        comparison.write(out)
        print(comparison.table(), flush=True)
    if opts.wandb:
        _to_wandb(cfg, report, out)
    print(f"eval: {out}", flush=True)
    return report


def _to_wandb(cfg: DictConfig, report: EvalReport, out: Path) -> None:
    import wandb

    config = cast(dict[str, Any], OmegaConf.to_container(cfg.eval, resolve=True))  # a DictConfig node: a dict
    run = wandb.init(
        project="polar_pl",
        name=str(cfg.run_name),
        dir=str(out),
        mode="offline",
        config=config,
        job_type="eval",
    )
    try:
        run.log(report.metrics("eval"))
        rows = [[t, n, c] for t, (n, c) in sorted(report.counts.items())]
        run.log(
            {
                "eval/tasks": wandb.Table(columns=["task_id", "n", "passed"], data=rows),
                "eval/pass_at_k": wandb.Image(str(out / "pass_at_k.png")),
            }
        )
    finally:
        run.finish()
