"""The CLI learning check's warm start: `case` answers inside the harness's own request, rendered
exactly as the engine renders that request, following the asked case with the configured share."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import pytest
from harness_shapes import prompt
from transformers import AutoModelForCausalLM, AutoTokenizer

from polar_pl.chat.render import render_chat
from polar_pl.tasks.answer import score_answer
from polar_pl.tasks.learnable import learnable_task
from polar_pl.warmstart.harness_case import case_answer, case_example, case_groups, warm_start_case
from polar_pl.warmstart.models import build_harness_model, ensure_harness_model
from polar_pl.warmstart.multiturn_warmstart import WORDS


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.mark.parametrize(("share", "expected"), [(1.0, 1.0), (0.0, 0.0)])
def test_answers_follow_the_asked_case_with_the_share(share, expected):
    rng = random.Random(1)
    for index in range(12):
        ex = case_example(rng, index, seed=0, share=share)
        task = learnable_task("case", index, 0)
        answer = ex.turns[-1][1]["content"]
        words = answer.split()
        assert ex.task == task.prompt and 4 <= len(words) <= 7 and all(w.lower() in WORDS for w in words)
        upper = task.answer_check.kind == "uppercase_fraction"
        assert sum((w == w.upper()) == upper for w in words) / len(words) == expected


def test_a_half_share_is_prompt_blind():
    rng = random.Random(0)
    caps, lower = learnable_task("case", 0), learnable_task("case", 1)
    for task, upper in ((caps, True), (lower, False)):
        mean = sum(score_answer(task, case_answer(rng, upper, 0.5)) for _ in range(400)) / 400
        assert mean == pytest.approx(0.5, abs=0.06)


def test_rows_continue_the_engines_render_of_the_request(tok):
    """Shared mode (the task is the request's last message, as in pi): prefix + segment must be
    the engine's own render of the request, then the answer as the model writes it, token for
    token, with the loss on the answer only."""
    p = prompt()
    (group,) = case_groups(tok, p, share=1.0, seed=0, rows=30, n_tasks=2)
    assert group.task is None and len(group.rows) == 30
    tasks = set()
    for ids, labels in group.rows[:10]:
        n_prompt = next(i for i, t in enumerate(labels) if t != -100)
        assert all(t != -100 for t in labels[n_prompt:])
        text = tok.decode(group.prefix + ids[:n_prompt])
        workdir = re.search(r"/tmp/polar-sbx-default-\w+/workspace", text).group(0)
        task = text.split("</reminder>\n\n")[1].split("<|im_end|>")[0]
        answer = tok.decode(ids[n_prompt:])
        assert answer.endswith("<|im_end|>")
        request = render_chat(tok, p.with_task(task, workdir), p.tools)[1]  # through the generation prompt
        assert request + tok.encode(answer, add_special_tokens=False) == group.prefix + ids
        words = answer[: -len("<|im_end|>")].split()
        assert all((w == w.upper()) == (task == task.upper()) for w in words)  # share 1.0
        tasks.add(task)
    assert len(tasks) > 5  # many random case prompts: the model must read the task, not learn two


def test_per_task_groups_are_the_checks_own_requests(tok):
    """A long block after the task (Claude Code's environment): one group per check task, each
    behind that task's whole request as the engine renders it."""
    p = prompt("environment " * 300)
    groups = case_groups(tok, p, share=0.7, seed=0, rows=8, n_tasks=2)
    assert [g.task for g in groups] == [learnable_task("case", i, 0).prompt for i in range(2)]
    for g in groups:
        workdir = re.search(r"/tmp/polar-sbx-default-\w+/workspace", tok.decode(g.prefix)).group(0)
        request = render_chat(tok, p.with_task(g.task, workdir), p.tools)[1]
        assert len(g.rows) == 4
        for ids, labels in g.rows:
            # the request's last token opens the segment, so the answer's first token is trained
            assert g.prefix + ids[:1] == request and labels[0] == -100 and labels[1] == ids[1] != -100


def test_warm_start_runs_fixed_steps_and_reports_the_reward_by_case(tiny_model_dir, tok):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    report = warm_start_case(model, tok, prompt(), steps=4, rows=40, refresh_every=2)
    assert report["steps"] == 4 and report["share"] == 0.7
    after = report["after"]
    assert 0.0 <= after["capitals"]["reward"] <= 1.0 and 0.0 <= after["lowercase"]["reward"] <= 1.0
    assert 0.0 <= after["ended_turn"] <= 1.0


def test_a_share_outside_zero_one_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="case must be in"):
        build_harness_model(tmp_path / "m", "pi", tmp_path / "no-base", tmp_path / "no-prefix", case=1.5)
    with pytest.raises(ValueError, match="case_steps must be positive"):
        build_harness_model(
            tmp_path / "m", "pi", tmp_path / "no-base", tmp_path / "no-prefix", case=0.7, case_steps=0
        )
    assert not (tmp_path / "m").exists()


def test_cli_refuses_a_share_outside_zero_one_without_a_traceback(tmp_path):
    cmd = [sys.executable, "-m", "polar_pl.cli", "warm-start", "experiment=cli_sanity", "harness=pi",
           f"model_dir={tmp_path / 'm'}", "warm_start.case=1.5"]  # fmt: skip
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert proc.returncode == 1 and "warm_start.case must be in [0, 1]" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "m").exists()


def test_a_model_built_inside_another_request_is_refused(tmp_path):
    """The check's model is trained inside the request the CLI sends with its extra_args
    (Claude Code's --system-prompt / --tools change it from ~15k tokens to ~1.9k): reusing one
    built with other arguments would train a policy on a context it never saw."""
    model = tmp_path / "tiny-model-claude_code-case"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tinymodel.json").write_text(json.dumps({"harness_extra_args": ["--tools", "Bash"]}))
    same = ensure_harness_model(
        model, "claude_code", tmp_path, tmp_path, case=0.7, extra_args=["--tools", "Bash"]
    )
    assert same == model
    with pytest.raises(ValueError, match=r"extra_args \['--tools', 'Bash'\], not \[\]"):
        ensure_harness_model(model, "claude_code", tmp_path, tmp_path, case=0.7)
