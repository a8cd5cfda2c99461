"""`polar-pl eval` end to end on CPU: conf/eval.yaml composed as the command composes it, the mini
harness in bubblewrap sandboxes, arith tasks scored by their evaluator, the real gateway, and a
scripted upstream (engine=vllm connected by URL to a ScriptedBackend) whose right answers are
known, so pass@k is known; an interrupted evaluation resumes without redoing a finished task; a
comparison gives the paired difference."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from polar_pl.eval.app import evaluate
from polar_pl.eval.stats import pass_at_k
from polar_pl.tasks.arith import split_tasks
from polar_pl.testing.scripted import Reply, serve_scripted

pytestmark = pytest.mark.slow
LIMIT, N = 6, 2
TASKS = split_tasks("arith", "test", LIMIT)


def scripted(right: set[int], calls: Counter):
    """Answers task i of TASKS right when i is in `right` (the second attempt of task 0 wrong)."""
    answers = {t.problem_statement: (i, t.answer_check.params["value"]) for i, t in enumerate(TASKS)}

    def reply(chat):
        question = chat["messages"][-1]["content"]
        i, value = answers[question]
        calls[i] += 1
        ok = i in right and not (i == 0 and calls[i] % 2 == 0)
        return Reply(f"{question.split('?')[0]} is {value if ok else value + 1}.")

    return reply


def eval_cfg(upstream, out, tiny_model_dir, *extra):
    overrides = [
        f"model_dir={tiny_model_dir}", "engine=vllm", f"engine.url={upstream.url}", "task=arith",
        "harness.tools=false", "+datamodule.gateway_options.token_faithful=false",
        f"eval.limit={LIMIT}", f"eval.n={N}", "eval.ks=[1,2]", f"eval.output_dir={out}",
        "datamodule.pools.running=4", *extra,
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="eval", overrides=overrides, return_hydra_config=True)
    HydraConfig().set_config(cfg)
    return cfg


def expected_pass(right: set[int]) -> tuple[float, float]:
    c = [(1 if i == 0 else 2) if i in right else 0 for i in range(LIMIT)]
    return sum(pass_at_k(N, x, 1) for x in c) / LIMIT, sum(pass_at_k(N, x, 2) for x in c) / LIMIT


def test_eval_scores_every_attempt_and_writes_the_report(tiny_model_dir, tmp_path) -> None:
    right, calls = {0, 2, 3}, Counter()
    with serve_scripted(scripted(right, calls), model_dir=tiny_model_dir) as upstream:
        report = evaluate(eval_cfg(upstream, tmp_path / "ev", tiny_model_dir, "eval.label=base"))
    p1, p2 = expected_pass(right)
    assert report.estimates[1].mean == pytest.approx(p1) and report.estimates[2].mean == pytest.approx(p2)
    assert report.infra_failures == 0 and sum(calls.values()) == LIMIT * N
    out = tmp_path / "ev"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label"] == "base" and summary["attempts"] == LIMIT * N and summary["tasks"] == LIMIT
    rows = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    assert {r["task_id"]: r["c"] for r in rows}["arith-test-0000"] == 1
    assert (out / "pass_at_k.png").stat().st_size > 0 and "| base | 6 | 2 |" in (
        out / "summary.md"
    ).read_text()
    logged = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(g["seq"] for g in logged) == list(range(LIMIT))
    assert all(a["answer"].startswith(g["prompt"].split("?")[0]) for g in logged for a in g["attempts"])


def test_interrupted_eval_resumes_without_redoing_a_task(tiny_model_dir, tmp_path) -> None:
    right, calls = {1, 4}, Counter()
    out = tmp_path / "ev"
    done_first: list[int] = []

    def stop_after_two(record):
        done_first.append(record["seq"])
        if len(done_first) == 2:
            raise KeyboardInterrupt

    with serve_scripted(scripted(right, calls), model_dir=tiny_model_dir) as upstream:
        with pytest.raises(KeyboardInterrupt):
            evaluate(eval_cfg(upstream, out, tiny_model_dir), on_group=stop_after_two)
        before = Counter(calls)
        report = evaluate(eval_cfg(upstream, out, tiny_model_dir))
    assert report.estimates[1].mean == pytest.approx(expected_pass(right)[0])
    for seq in done_first:  # a finished task is not asked again
        assert calls[seq] == before[seq] == N
    logged = [json.loads(x)["seq"] for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(logged) == list(range(LIMIT))


def test_compare_gives_the_paired_difference(tiny_model_dir, tmp_path) -> None:
    outs = {}
    for label, right in (("base", {0}), ("trained", {0, 1, 2, 3})):
        with serve_scripted(scripted(right, Counter()), model_dir=tiny_model_dir) as upstream:
            extra = [f"eval.label={label}"] + ([f"eval.compare={outs['base']}"] if outs else [])
            evaluate(eval_cfg(upstream, tmp_path / label, tiny_model_dir, *extra))
        outs[label] = tmp_path / label
    comparison = json.loads((outs["trained"] / "comparison.json").read_text())
    gain = expected_pass({0, 1, 2, 3})[0] - expected_pass({0})[0]
    assert (
        comparison["pass@1_diff"]["mean"] == pytest.approx(gain)
        and comparison["pass@1_diff"]["tasks"] == LIMIT
    )
    cli = subprocess.run(
        [sys.executable, "-m", "polar_pl.cli", "eval", "--compare", str(outs["base"]), str(outs["trained"])],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "paired difference of pass@1 (trained - base) over 6 tasks: 50.0" in cli.stdout


def test_an_evaluation_whose_sandboxes_cannot_start_stops_instead_of_scoring_zero(
    tiny_model_dir, tmp_path
) -> None:
    """Attempts the infrastructure failed say nothing about the model: they are never counted as
    wrong answers, and when the first task's attempts all fail alike the evaluation stops with that
    failure (as a training run does) and records nothing, so a rerun starts clean."""
    from polar_pl.datamodule.failfast import RolloutsFailing

    missing, calls = tmp_path / "no-such-folder", Counter()
    with serve_scripted(scripted(set(), calls), model_dir=tiny_model_dir) as upstream:
        cfg = eval_cfg(upstream, tmp_path / "ev", tiny_model_dir, f"sandbox.base_dir={missing}")
        with pytest.raises(RolloutsFailing, match=f"No such file or directory: '{missing}/"):
            evaluate(cfg)
    assert sum(calls.values()) == 0
    log = tmp_path / "ev" / "rollouts.jsonl"
    assert not log.exists() or not log.read_text().strip()
