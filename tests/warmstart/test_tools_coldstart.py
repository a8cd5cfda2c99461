"""The tool-use cold start's data: demonstrations that really solve their tasks when a shell runs
them, only train-split tasks, the model's own tool-call format (what the gateway parses back), the
loss on the assistant's tokens only; and a few steps on SmolLM2 that lower it."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from harness_shapes import TOOLS, prompt
from transformers import AutoModelForCausalLM, AutoTokenizer

from polar_pl.chat.render import render_chat
from polar_pl.chat.toolparse import parse_tool_calls
from polar_pl.tasks.answer import score_answer
from polar_pl.tasks.arith import split_tasks
from polar_pl.utils.cpu import bf16_is_native
from polar_pl.warmstart.harness_conversations import tool_task_examples
from polar_pl.warmstart.harness_data import IGNORE, render_tail, sandbox_workdir, tail_tokens
from polar_pl.warmstart.tools_coldstart import cold_start_tools, demonstration_group


@pytest.fixture(scope="module")
def tok(smollm2_model_dir):
    return AutoTokenizer.from_pretrained(str(smollm2_model_dir))


def _commands(ex) -> list[str]:
    return [
        json.loads(call["function"]["arguments"])["command"]
        for kind, turn in ex.turns
        if kind == "assistant"
        for call in turn.get("tool_calls") or []
    ]


def _workspace_patch(workdir: Path, setup: tuple[str, ...], commands: list[str]) -> str:
    """The patch a sandbox would report: setup in the base commit, the commands' changes after it."""

    def sh(cmd: str) -> str:
        return subprocess.run(
            ["bash", "-c", cmd], cwd=workdir, check=True, capture_output=True, text=True
        ).stdout

    sh("git init -q . && git config user.email t@t && git config user.name t")
    for cmd in setup:
        sh(cmd)
    sh("git add -A && git commit -q --allow-empty -m base")
    outputs = [sh(cmd) for cmd in commands]
    assert outputs[-1] == ""  # the last command writes the result file and prints nothing
    return sh("git add -A && git diff --cached")


def test_every_demonstration_solves_its_task_when_a_shell_runs_it(tmp_path):
    """Attack on the data: a demonstration whose commands do not produce the scored file would teach
    the model to fail. Each kind's commands, run by bash in the task's own workspace, must score 1
    with the task's evaluator, and a `cat` demonstration must show exactly what cat prints."""
    tasks = split_tasks("tools", "train", 40, seed=0)
    exs = tool_task_examples("pi", TOOLS, tasks, seed=0)
    kinds = set()
    for i, (task, ex) in enumerate(zip(tasks, exs, strict=True)):
        assert ex.task == task.problem_statement
        commands = _commands(ex)
        kinds.add(len(commands))
        work = tmp_path / str(i)
        work.mkdir()
        patch = _workspace_patch(work, task.setup_commands, commands)
        assert score_answer(task, "Done.", patch) == 1.0, (task.problem_statement, commands)
        if len(commands) == 2:  # cat data.txt, then the item: the tool result is what cat printed
            shown = next(turn["content"] for kind, turn in ex.turns if kind == "tool")
            assert shown == (work / "data.txt").read_text().rstrip("\n")
    assert kinds == {1, 2}  # both kinds (a product; a value read from the file) are demonstrated


def test_no_held_out_task_is_ever_demonstrated():
    held_out = {t.extra["problem"] for t in split_tasks("tools", "test")}
    demonstrated = {t.extra["problem"] for t in split_tasks("tools", "train", 1000, seed=0)}
    assert len(held_out) == 300 and not held_out & demonstrated


def test_rows_are_the_models_tool_format_and_train_only_the_assistant(tok):
    """With SmolLM2's tokenizer and template: the request plus a row renders token for token as the
    engine renders the whole conversation, the trained text parses back (chat/toolparse.py, what
    the gateway runs on the model's output) into the demonstrated shell calls, and no tool result
    or task text is trained."""
    p = prompt()
    tasks = split_tasks("tools", "train", 12, seed=1)
    exs = tool_task_examples("pi", TOOLS, tasks, seed=1)
    group = demonstration_group(tok, p, exs, seed=1)
    assert len(group.rows) == 12
    for ex, (ids, labels) in zip(exs, group.rows, strict=True):
        request = render_chat(tok, p.with_task(ex.task, sandbox_workdir(random.Random(1))), TOOLS)[1]
        assert group.prefix == request[: len(group.prefix)]
        tail_ids, _ = tail_tokens(tok, *render_tail(tok, ex))
        assert ids[-len(tail_ids) :] == tail_ids
        trained = [t for t in labels if t != IGNORE]
        turns = tok.decode(trained).split("<|im_end|>")[:-1]
        calls = [c for text in turns for c in parse_tool_calls(text).tool_calls]
        assert [json.loads(c["function"]["arguments"])["command"] for c in calls] == _commands(ex)
        assert all(c["function"]["name"] == "bash" for c in calls)
        assert "(no output)" not in tok.decode(trained) and ex.task not in tok.decode(trained)


@pytest.mark.slow
def test_a_few_steps_on_smollm2_lower_the_demonstrations_loss(smollm2_model_dir, tok):
    import torch

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_model_dir), dtype=torch.float32)
    bf16 = bf16_is_native()  # as experiment=smollm2_tools resolves it: emulated bf16 is ~30x slower
    report = cold_start_tools(model, tok, prompt(), steps=4, lr=5e-4, n_tasks=16, seed=0, bf16=bf16)
    assert report["steps"]["long"] == 4 and report["tasks"] == 16 and report["bf16"] == bf16
    assert report["loss_last"]["long"] < 0.6 * report["loss_first"]["long"], report
