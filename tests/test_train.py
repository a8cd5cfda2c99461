"""`python train.py` end to end on CPU: `train(cfg)` in-process on the composed config (shrunk, as
lightning-hydra-template's tests/test_train.py does), then as a subprocess: learning sanity, a
Hydra sweep with one W&B offline run per value, and resume from a checkpoint."""

from __future__ import annotations

import collections
import csv
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from fixture_paths import CONF, REPO
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from recipes import tiny

from polar_pl.engine.vllm_engine import vllm_installed, vllm_python
from polar_pl.gateway.store.traces import TraceStore
from polar_pl.testing.learning import CONTROL_OVERRIDES, start_and_lead


def train(*overrides: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`python train.py <overrides>` on the tiny model's recipe unless they name one."""
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "train.py", *tiny(*overrides)],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def warm_start(*overrides: str) -> None:
    """Build the warm-started model these overrides train from (train.py refuses to start without it)."""
    proc = subprocess.run(
        [sys.executable, "-m", "polar_pl.cli", "warm-start", *overrides],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def metrics(run_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(open(run_dir / "csv" / "metrics.csv")))


def rewards_by_step(run_dir: Path) -> list[float]:
    return [float(r["rollout/reward_mean"]) for r in metrics(run_dir) if r.get("rollout/reward_mean")]


def compose_train(run_dir: Path, model_dir: Path, *overrides: str):
    """The root config as train.py composes it (the tiny model's recipe unless `overrides` name one),
    run directory and model set by hand (no Hydra run)."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(
            "config", overrides=tiny(f"model_dir={model_dir}", *overrides), return_hydra_config=True
        )
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]  # as @hydra.main hands it over: the hydra node lives in HydraConfig only
    return cfg


def test_train_in_process_on_the_composed_config(tiny_model_dir, tmp_path):
    """`train(cfg)` on the real config groups, shrunk to one step of one group of two: rollouts
    through the gateway, a GRPO step, the weight push, a checkpoint from the callbacks group."""
    from polar_pl.training import train as train_cfg

    cfg = compose_train(
        tmp_path, tiny_model_dir, "debug=fast", "steps=1", "checkpoint_every=1",
        "torch_threads=null", "datamodule.progress=false", "datamodule.max_groups_in_flight=1",
    )  # fmt: skip
    logged = train_cfg(cfg)
    assert "rollout/reward_mean" in logged and logged["train/policy_version"] == 1.0
    assert rewards_by_step(tmp_path) and (tmp_path / "checkpoints" / "last.ckpt").exists()
    store = TraceStore(tmp_path / "traces.db")
    try:
        # groups of two attempts; the next group may have started while the step trained
        sizes = collections.Counter(s.group_id for s in store.sessions())
        assert sizes and max(sizes.values()) == 2, sizes
    finally:
        store.close()


def group_seqs(run_dir: Path) -> set[int]:
    store = TraceStore(run_dir / "traces.db")
    try:
        return {int(s.group_id.rsplit("-g", 1)[1]) for s in store.sessions() if s.group_id}
    finally:
        store.close()


def column(run_dir: Path, key: str) -> list[float]:
    return [float(r[key]) for r in metrics(run_dir) if r.get(key)]


def curve(values: list[float]) -> list[float]:
    return [round(x, 3) for x in values]


# The CLI learning checks: harness, experiment, and the bars each run must clear. Measured with
# bench/cli_learning.py --harness H [--experiment E] --seed N (push run of 8 steps, control of 3).
CLI_CHECKS = [
    # pi, seeds 0-2: start 0.66-0.71, push's last 3 steps 0.84-0.94 (+0.13 to +0.28), each case
    # 0.80-0.95. Then a clean-clone CI run ended capitals at 0.746 (curve 0.69 -> 0.83, lead > 0.1)
    # against a bar of 0.75, and a run alone on an idle machine led by +0.092 (control 0.77, 0.69;
    # push 0.65 -> 0.76-0.88) against a bar of 0.1: the bars sat at the edge of what this check
    # does. Lead 0.05 and each case 0.65 (~1.5-2 sd under the five runs' means, +0.16 and 0.84)
    # then failed a clean clone too: capitals 0.75, 0.64, 0.77, 0.64, 0.73, 0.71, 0.51, 0.68 (last 3
    # 0.63), lowercase 0.63 -> 0.92 (last 3 0.89), lead +0.10: a group of 8 a case is that noisy.
    # Each case 0.6, as Claude Code's: ignoring the prompt keeps the two cases' sum <= 1, so both
    # over 0.6 (a sum over 1.2, ~4 sd of a step's noise away) still proves the prompt is read.
    pytest.param("pi", "cli_sanity", 0.05, 0.6, 12, id="pi"),  # 3 epochs a step, a push each
    # Claude Code on its lean request (--system-prompt, --tools Bash): the task sits before Claude
    # Code's environment block, farther from the answer; groups of 16, a push a step, lr 1e-3 warmed
    # up over 10 steps (seeds 0-1 alone: lead ~+0.2, each case 0.73-0.90; every workspace at
    # /workspace, seeds 0-3: last three 0.88-0.94, each case 0.83-0.98). Its lr 2e-3 predecessor
    # led by +0.21 to +0.30 alone but failed 2 of 4 clean-clone CI runs, one case sinking. 0.6 sits
    # above what ignoring the prompt allows for both cases at once (their sum <= 1). What the
    # checks reach: docs/results.md.
    pytest.param("claude_code", "cli_sanity_claude_code", 0.1, 0.6, 6, id="claude_code"),  # a push a step
]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # beside the other on 2 cores in `make test`: 645-869 s, >900 s seen
@pytest.mark.parametrize(("harness", "experiment", "lead", "each_case", "pushes"), CLI_CHECKS)
def test_cli_learns_to_read_the_prompt_against_a_no_push_control(
    harness, experiment, lead, each_case, pushes, tiny_model_dir, tmp_path
):
    """`python train.py experiment=cli_sanity harness=pi` (and Claude Code's lean variant): the
    real CLI in bwrap sandboxes, its calls through the gateway, GRPO pushing weights to the
    engine the CLI talks to. The `case` task asks for capitals or lowercase by prompt: a policy
    that ignores the prompt scores <= 0.5 on average, so the reward rises above the no-push
    control (the same run with module/weight_sync=none: the engine keeps the start's weights)
    only by reading it, and must rise for both cases. Harness errors are never scored (issue
    14): there must be none here."""
    push, control = tmp_path / "push", tmp_path / "control"
    warm_start(f"experiment={experiment}", f"harness={harness}")  # `make test` built it: a no-op there
    train(f"experiment={experiment}", f"harness={harness}", f"hydra.run.dir={push}")
    train(
        f"experiment={experiment}",
        f"harness={harness}",
        *CONTROL_OVERRIDES,
        "steps=2",
        f"hydra.run.dir={control}",
    )
    r_push, r_control = rewards_by_step(push), rewards_by_step(control)
    print(f"{harness} case reward by step: push {curve(r_push)}, control {curve(r_control)}")
    for key in ("rollout/reward_by_check/uppercase_fraction", "rollout/reward_by_check/lowercase_fraction",
                "train/kl", "train/logprob_gap_mean", "train/staleness_mean"):  # fmt: skip
        print(f"  push {key}: {curve(column(push, key))}")  # what a failure needs explained
    _, measured = start_and_lead(r_push, r_control)
    assert measured > lead, (r_push, r_control)
    # Both cases, last 3 steps: answers that ignore the prompt have capitals + lowercase rewards
    # summing to <= 1.
    for check in ("uppercase_fraction", "lowercase_fraction"):
        values = column(push, f"rollout/reward_by_check/{check}")
        assert sum(values[-3:]) / 3 > each_case, (check, values)
    for run in (push, control):
        for key in ("rollout/masked", "rollout/harness_error_policy", "rollout/harness_error_infra"):
            assert sum(column(run, key)) == 0, (run.name, key)
    versions = column(push, "train/policy_version")
    assert versions == sorted(versions) and versions[-1] >= pushes, versions
    assert set(column(control, "train/policy_version")) == {0.0}


def test_a_run_whose_sandboxes_all_fail_stops_with_the_failure_as_its_last_line(tiny_model_dir, tmp_path):
    """Issue 27: every sandbox failed to start, each group came back without rows, and the run
    drew group after group at 80% CPU with no line after the first rollout's until it was killed.
    Now the first group's worth of rollouts failing alike stops it: exit 1, the failure last, in
    the terminal and in train.log alike."""
    missing, run = tmp_path / "no-such-folder", tmp_path / "run"
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "train.py", "experiment=tiny", "debug=fast", f"sandbox.base_dir={missing}", f"hydra.run.dir={run}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False,
    )  # fmt: skip
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "the first 2 rollouts all failed in INIT" in last, last
    assert f"FileNotFoundError: [Errno 2] No such file or directory: '{missing}/" in last, last
    assert (run / "train.log").read_text().strip().splitlines()[-1] == last


@pytest.mark.slow
def test_sweep_writes_one_wandb_offline_run_per_value(tiny_model_dir, tmp_path):
    sweep = tmp_path / "sweep"
    train(
        "-m",
        "debug=fast",
        "logger=default",
        "steps=1",
        "merge=prefix,per_request",
        f"hydra.sweep.dir={sweep}",
    )
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in runs] == ["0", "1"]
    for run in runs:
        assert list((run / "wandb").glob("offline-run-*")), f"no W&B offline run in {run}"
        assert rewards_by_step(run), f"no rollout/reward_mean in {run}/csv/metrics.csv"


@pytest.mark.slow
def test_resume_continues_step_count_and_task_cursor(tiny_model_dir, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    train("debug=fast", "steps=2", "checkpoint_every=1", f"hydra.run.dir={first}")
    ckpt = first / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=False)
    (dm_state,) = [v for k, v in state.items() if k.endswith("RolloutDataModule")]
    # Checkpoints follow optimiser steps: a batch whose group of 2 scored alike trains nothing
    # (skipped, global step unchanged) and is not saved, so the last one may hold batch 1 alone.
    done = dm_state["batches_done"]
    skipped = sum(
        float(r["train/skipped"]) for r in metrics(first) if r.get("train/skipped") and int(r["step"]) < done
    )
    assert done >= 1 and state["global_step"] == done - skipped
    cursor = dm_state["service"]
    trained = set(range(cursor["start_seq"])) | set(cursor["skip_seqs"])
    assert len(trained) == done  # one group per step, each committed
    train("debug=fast", f"steps={done + 1}", f"ckpt_path={ckpt}", f"hydra.run.dir={second}")
    steps = [int(r["step"]) for r in metrics(second) if r.get("rollout/reward_mean")]
    assert steps == [done]  # only the step after the checkpoint ran
    assert not (group_seqs(second) & trained), "resumed run repeated groups it had trained on"


@pytest.mark.slow
def test_vllm_engine_with_disk_weight_updates_matches_the_trainer(tiny_model_dir, tmp_path):
    """engine=vllm (CPU build) with from-disk weight pushes: after each update the engine's
    logprobs on its sampled tokens equal the trainer's (only fresh rows: max_staleness=0)."""
    if not vllm_installed():
        pytest.skip(f"vLLM CPU environment missing at {vllm_python()} (make vllm-env installs it)")
    run = tmp_path / "vllm"
    train(
        "debug=fast",
        "engine=vllm",
        "engine.dtype=float32",
        "module/weight_sync=disk",
        "datamodule.max_staleness=0",
        # groups of 2: both answers often score alike, and a step without signal neither trains
        # nor pushes (a CI run's third step: versions [1, 2, 2]); here every step pushes
        "module.filter_zero_variance=false",
        "steps=3",
        f"hydra.run.dir={run}",
    )
    rows = [r for r in metrics(run) if r.get("rollout/reward_mean")]
    assert len(rows) == 3
    gaps = [float(r["train/logprob_gap_mean"]) for r in rows]
    stale = [float(r["train/staleness_max"]) for r in rows]
    versions = [int(float(r["train/policy_version"])) for r in rows]
    print(f"vLLM trainer/engine logprob gap by step: {gaps}, staleness {stale}, versions {versions}")
    assert versions == [1, 2, 3]  # every disk push reached vLLM and bumped its version
    # Rows sampled with the weights the trainer holds agree to numerics. (Lightning fetches batch
    # k+1 before step k pushes, so later batches are one version behind at training time; the
    # exact post-push agreement is checked in tests/module/test_weight_sync.py.)
    assert all(g < 0.01 for g, s in zip(gaps, stale, strict=True) if s == 0) and stale[0] == 0


def test_real_model_trains_a_few_steps_with_held_out_eval_and_export(smollm2_model_dir, tmp_path):
    """experiment=smollm2_arith shrunk to two steps: SmolLM2 through the mini harness, the gateway
    and the embedded engine; the trainer's logprobs of fresh samples equal the engine's, every
    step's push reaches the engine, entropy and KL are logged, the held-out evaluation runs before
    and after, and `polar-pl engine --model <run>/model` serves the exported folder."""
    run = tmp_path / "real"
    train(
        "experiment=smollm2_arith", f"model_dir={smollm2_model_dir}", "steps=2", "logger=csv",
        "trainer.precision=32-true",  # the engine samples in fp32: the gap bound below is fp32's
        "datamodule.group_size=4", "datamodule.groups_per_step=2", "datamodule.max_staleness=0",
        "datamodule.dynamic_sampling=false",
        "harness.max_tokens=16", "datamodule.gateway_options.max_tokens_cap=16",
        "callbacks.held_out_eval.limit=4", "callbacks.held_out_eval.n=2", "callbacks.held_out_eval.ks=[1,2]",
        "module.kl={_target_:polar_pl.module.losses.kl_k3_plus,_partial_:true}", "module.kl_coef=0.01",
        "module.filter_zero_variance=false", f"hydra.run.dir={run}",
    )  # fmt: skip
    rows = [r for r in metrics(run) if r.get("train/logprob_gap_mean")]
    assert [int(float(r["train/policy_version"])) for r in rows] == [1, 2]
    fresh = [float(r["train/logprob_gap_mean"]) for r in rows if float(r["train/staleness_max"]) == 0]
    assert fresh and max(fresh) < 0.01
    assert all(float(r["train/entropy"]) > 0 and r.get("train/kl") and r.get("train/kl_ref") for r in rows)
    logged = {k for r in metrics(run) for k, v in r.items() if v}
    assert {"eval/before/pass@1", "eval/after/pass@2", "eval/pass@1_gain"} <= logged
    assert (run / "eval" / "comparison.json").exists() and (run / "eval" / "after" / "tasks.jsonl").exists()
    from polar_pl.engine.process import ServerProcess
    from polar_pl.utils.serving import free_port

    # `polar-pl engine --model <run>/model`, the command the run's last line names, as a process
    port = free_port()
    cmd = [sys.executable, "-m", "polar_pl.cli", "engine", "--model", str(run / "model"), "--port", str(port)]
    cmd += ["--served-model-name", "trained", "--threads", "1", "--max-model-len", "512"]
    engine = ServerProcess(cmd, f"http://127.0.0.1:{port}", name="engine")
    engine.start(timeout=180)
    try:
        body = {
            "model": "trained",
            "messages": [{"role": "user", "content": "What is 2 plus 2?"}],
            "max_tokens": 8,
        }
        answer = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=120)
    finally:
        engine.stop()
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]


def test_time_budget_ends_the_run_and_its_end_callbacks_still_run(tiny_model_dir, tmp_path):
    """`trainer.max_time` bounds the training loop's wall time (experiment=smollm2_arith uses it):
    a run asked for 1000 steps stops after the step that crosses the budget, exits cleanly and
    still exports its final policy."""
    run = tmp_path / "budget"
    train(
        "debug=fast", "steps=1000", "trainer.max_time=00:00:00:10",
        "+callbacks.export_model._target_=polar_pl.module.export.ExportModel",
        f"+callbacks.export_model.out_dir={run}/model", f"hydra.run.dir={run}",
    )  # fmt: skip
    steps = [r for r in metrics(run) if r.get("time/step_s")]
    assert 1 <= len(steps) < 1000
    assert (run / "model" / "config.json").exists()


def test_lora_run_pushes_the_adapter_and_exports_it(tiny_model_dir, tmp_path):
    """`train.py module.lora.rank=4`: every step pushes the adapter alone (a fraction of the full
    weights' bytes), the engine's logprobs of fresh samples equal the trainer's, and the run ends
    with the adapter in PEFT's format and the merged model beside it."""
    run = tmp_path / "lora"
    train(
        "debug=fast", "steps=2", "module.lora.rank=4", "module.lora.lr=1e-2", "module.lora.export_merged=true",
        "datamodule.max_staleness=0", "module.filter_zero_variance=false",
        "+callbacks.export_model._target_=polar_pl.module.export.ExportModel",
        f"+callbacks.export_model.out_dir={run}/model", f"hydra.run.dir={run}",
    )  # fmt: skip
    rows = [r for r in metrics(run) if r.get("train/push_mb")]
    assert [int(float(r["train/policy_version"])) for r in rows] == [1, 2]
    full_mb = sum(p.stat().st_size for p in tiny_model_dir.glob("*.safetensors")) / 1e6
    assert all(0 < float(r["train/push_mb"]) < 0.2 * full_mb for r in rows), (rows, full_mb)
    fresh = [float(r["train/logprob_gap_mean"]) for r in rows if float(r["train/staleness_max"]) == 0]
    assert fresh and max(fresh) < 0.01
    # calls made after a push asked for the adapter by name and were sampled by it (on a loaded
    # machine every call of a 2-step run can come before the first push: then there are none). The
    # engine refuses a name it no longer holds and the gateway asks again under the current one, so
    # a call's first token is always the named adapter's; a push landing mid-call samples the rest
    # (recorded per token). Failure guarded: ('tiny-lora-v1', 2), v1's name served by v2.
    from polar_pl.gateway.store.traces import TraceReader
    from polar_pl.utils.adapters import adapter_version

    with TraceReader(run / "traces.db") as store:
        served = {
            (r.normalized_request["model"], r.token_policy_versions[0])
            for r in store.records()
            if r.response_ids
        }
    adapters = {(adapter_version(m), v) for m, v in served if adapter_version(m) is not None}
    assert all(a == v for a, v in adapters), served
    assert (run / "adapter" / "adapter_config.json").exists() and (run / "model" / "config.json").exists()


def test_tree_collate_trains_each_group_on_its_prompt_once(tiny_model_dir, tmp_path):
    """`datamodule.collate_mode=tree`: each group's shared prompt is laid out once (most of a
    learnable row is its prompt), and the trainer's logprobs through the tree equal the engine's."""
    run = tmp_path / "tree"
    train(
        "debug=fast", "steps=2", "datamodule.collate_mode=tree", "datamodule.group_size=4",
        "module.filter_zero_variance=false", f"hydra.run.dir={run}",
    )  # fmt: skip
    shared = column(run, "rollout/shared_token_frac")
    assert len(shared) == 2 and min(shared) > 0.5, shared
    rows = [r for r in metrics(run) if r.get("train/logprob_gap_mean")]
    fresh = [float(r["train/logprob_gap_mean"]) for r in rows if float(r["train/staleness_max"]) == 0]
    assert fresh and max(fresh) < 0.01, rows
