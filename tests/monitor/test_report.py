"""What a run shows and leaves behind: the per-step line and time breakdown, start-up lines, no
start-up noise, rollouts.jsonl, the plots (also via `polar-pl plot`), and W&B images and table."""

from __future__ import annotations

import json

import pytest

from polar_pl.cli import main as cli
from polar_pl.monitor.plots import PLOTS, read_steps
from polar_pl.monitor.report import table_rows
from polar_pl.monitor.rollouts import read_rollouts
from polar_pl.monitor.steplog import step_line, step_times

PNG = b"\x89PNG\r\n\x1a\n"


def test_step_times_split_the_wall_time():
    t = step_times({"train/old_logprob_s": 0.5, "train/update_s": 1.0, "train/push_s": 0.25}, 4.0, 2.0)
    assert t == {
        "time/rollout_wait_s": 2.0, "time/old_logprobs_s": 0.5, "time/update_s": 1.0, "time/push_s": 0.25,
        "time/other_s": 0.25, "time/step_s": 4.0,
    }  # fmt: skip


def test_step_line_has_the_numbers_a_user_watches():
    m = {"rollout/reward_mean": 0.4123, "rollout/reward_std": 0.21, "rollout/pass_rate": 0.125,
         "rollout/trainable_tokens": 384, "train/policy_version": 3, "rollout/engine_busy": 0.45,
         **step_times({"train/update_s": 0.9}, 7.9, 4.1)}  # fmt: skip
    line = step_line(3, 20, m)
    assert line.startswith("step 3/20 | reward 0.412 ± 0.210 | pass 0.12 | tokens 384 | 7.9 s (wait 4.1")
    assert line.endswith("| v3 | engine 45%")
    assert "skipped" in step_line(4, 20, {**m, "train/skipped": 1.0})
    assert step_line(1, None, {}).startswith("step 1/? | reward - | pass -")  # nothing logged yet


def test_trajectory_table_samples_best_and_worst_first():
    lines = [{"step": 1, "rollout_id": f"r{i}", "reward": r, "breaks": {"drift": i % 2}}
             for i, r in enumerate([0.3, 0.9, 0.1, 0.5])]  # fmt: skip
    rows = table_rows(lines, per_step=3)
    assert [r[3] for r in rows] == [0.9, 0.1, 0.3]
    assert "breaks: drift 1" in rows[0][-1]


@pytest.mark.slow
def test_a_short_run_prints_progress_and_leaves_plots_rollouts_and_wandb_media(short_run, tmp_path):
    run, output = short_run
    log = (run / "train.log").read_text()
    for line in ("engine ready", "gateway ready", "first rollout", "step 1/2 | reward", "step 2/2 | reward",
                 "plots:", "polar-pl view --run"):  # fmt: skip
        assert line in log, f"{line!r} missing from train.log"
    for noise in ("💡", "deprecated", "ModelCheckpoint", "Loading weights", "anonymous setting", "Seed set"):
        assert noise not in output, f"start-up noise printed: {noise!r}"

    rows = read_steps(run)
    assert len(rows) == 2
    for key in ("time/step_s", "time/rollout_wait_s", "time/old_logprobs_s", "time/update_s", "time/push_s",
                "rollout/busy_running", "time/session_running_s"):  # fmt: skip
        assert all(key in r for r in rows), key
    step_s = [float(r["time/step_s"]) for r in rows]
    parts = [sum(float(r[f"time/{k}"]) for k in ("rollout_wait_s", "old_logprobs_s", "update_s", "push_s",
                                                  "other_s")) for r in rows]  # fmt: skip
    assert parts == pytest.approx(step_s)

    lines = read_rollouts(run)
    assert [x["step"] for x in lines] == [1, 1, 2, 2]  # debug=fast: one group of two per step
    assert all(x["session_id"] and x["harness"] == "mini" and x["calls"] >= 1 for x in lines)
    rewards = [float(r["rollout/reward_mean"]) for r in rows]
    assert rewards[0] == pytest.approx(sum(x["reward"] for x in lines[:2]) / 2)

    pngs = sorted((run / "plots").glob("*.png"))
    assert len(pngs) == len(PLOTS) and all(p.read_bytes()[:8] == PNG for p in pngs)
    assert cli(["plot", "--run", str(run), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [p.name for p in pngs]

    (wandb_run,) = (run / "wandb").glob("offline-run-*")
    images = list((wandb_run / "files" / "media" / "images").rglob("*.png"))
    assert len(images) == len(PLOTS)
    (table,) = (wandb_run / "files" / "media" / "table").glob("trajectories_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"][:4] == ["step", "group", "session", "reward"] and len(data["data"]) == 4


def test_a_skipped_step_shows_its_own_times_not_the_last_ones(caplog):
    """Lightning keeps a metric's last value in callback_metrics: a skipped batch (no optimiser
    step) printed the previous step's update time, and `train/skipped` stuck to every later step."""
    from types import SimpleNamespace

    from polar_pl.monitor.steplog import StepLog

    logged: list[dict] = []
    module = SimpleNamespace(log_dict=lambda d, **kw: logged.append(d))
    dm = SimpleNamespace(wait_total_s=0.0, batches_done=0, steps=3)
    trainer = SimpleNamespace(datamodule=dm, global_step=0, callback_metrics={}, is_global_zero=True)
    cb = StepLog()
    cb.setup(trainer, module, "fit")
    caplog.set_level("INFO", logger="polar_pl.train")
    for trained in (True, False, True):
        cb.on_train_batch_start(trainer, module, None, dm.batches_done)
        if trained:
            trainer.global_step += 1
            trainer.callback_metrics.update({"train/update_s": 0.5, "train/old_logprob_s": 0.1})
        else:
            trainer.callback_metrics["train/skipped"] = 1.0  # as the module logs it, once
        cb.on_train_batch_end(trainer, module, None, None, dm.batches_done)
        dm.batches_done += 1
    assert [d["time/update_s"] for d in logged] == [0.5, 0.0, 0.5]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert ["skipped" in line for line in lines] == [False, True, False]
