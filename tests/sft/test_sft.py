"""SFT generation end to end on CPU: conf/sft.yaml composed as the command composes it, the mini
harness in local sandboxes, built-in tasks scored by the real evaluator, the real gateway, and a
scripted upstream (engine=vllm connected by URL to a ScriptedBackend server) that applies the
reference fix for two tasks and gives up on the third."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from rich.console import Console
from sft_upstream import solver

from polar_pl.gateway.store.traces import read_records
from polar_pl.harness.mini_agent import TOOLS
from polar_pl.sft import generate
from polar_pl.tasks.builtin import load_suite
from polar_pl.testing.scripted import serve_scripted

pytestmark = pytest.mark.slow

TASKS = ["calc-1", "graphkit-3", "strkit-1"]
SOLVED = {"calc-1", "graphkit-3"}
GROUP_SIZE = 2


@pytest.fixture(scope="module")
def upstream(tiny_model_dir):
    tasks = [t for t in load_suite() if t.instance_id in TASKS]
    with serve_scripted(solver(tasks, SOLVED), model_dir=tiny_model_dir) as server:
        yield server


# The scripted upstream answers from the chat body, which token-in (token-faithful) requests do not
# carry; and its reference fix is one long tool call, longer than the CPU default response cap.
SCRIPTED_GATEWAY = (
    "+datamodule.gateway_options.token_faithful=false",
    "datamodule.gateway_options.max_tokens_cap=null",
)


def sft_cfg(upstream, out_dir: Path, tiny_model_dir: Path, *extra: str):
    overrides = [
        f"model_dir={tiny_model_dir}",
        "engine=vllm",
        f"engine.url={upstream.url}",
        f"task.instance_ids=[{','.join(TASKS)}]",
        "harness.max_tokens=null",  # the scripted fix is one long tool call (the CPU default cuts at 64)
        *SCRIPTED_GATEWAY,
        f"datamodule.group_size={GROUP_SIZE}",
        "datamodule.progress=false",
        "datamodule.pools.running=2",
        "datamodule.pools.postrun=2",
        f"sft.output_dir={out_dir}",
        *extra,
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="sft", overrides=overrides, return_hydra_config=True)
    HydraConfig().set_config(cfg)
    return cfg


@pytest.fixture(scope="module")
def full_run(upstream, tiny_model_dir, tmp_path_factory):
    """One uninterrupted run, its progress drawn on a (recorded) terminal."""
    out = tmp_path_factory.mktemp("sft-full")
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    stats = generate(sft_cfg(upstream, out, tiny_model_dir, "datamodule.progress=true"), console=console)
    return out, stats, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # without ANSI codes


def load(out: Path, name: str, fmt: str) -> datasets.Dataset:
    ext = "jsonl" if fmt == "json" else fmt
    return datasets.load_dataset(fmt, data_files=str(out / f"{name}.{ext}"), split="train")


def logged_attempts(out: Path) -> list[dict]:
    return [
        a for line in (out / "rollouts.jsonl").read_text().splitlines() for a in json.loads(line)["attempts"]
    ]


def test_stats_count_every_attempt_and_keep_the_verified(full_run):
    out, stats, _ = full_run
    assert stats["complete"] and stats["groups_done"] == stats["groups_total"] == len(TASKS)
    assert stats["attempts"] == len(TASKS) * GROUP_SIZE
    assert stats["accepted"] == len(SOLVED) * GROUP_SIZE
    assert stats["acceptance_rate"] == pytest.approx(len(SOLVED) / len(TASKS))
    assert stats["rejected"] == {"below_threshold": GROUP_SIZE}
    assert stats["tasks_solved"] == len(SOLVED) and stats["trajectories"] == stats["accepted"]
    # user, assistant (tool call), tool result, assistant (final answer)
    assert stats["mean_turns"] == 4 and stats["mean_assistant_turns"] == 2 and stats["mean_calls"] == 2
    assert set(stats["breaks"]) >= {"compaction", "drift", "side_call", "truncation"}
    assert stats["token_rows"] == stats["accepted"] + sum(stats["breaks"].values())
    assert json.loads((out / "stats.json").read_text()) == stats
    card = (out / "README.md").read_text()
    assert "config_name: chat" in card and "| acceptance_rate | 0.6667 |" in card
    assert "engine:\n  _target_: polar_pl.engine.vllm_engine.VLLMEngine" in card  # the resolved config
    assert "threshold: 1.0" in card and f"store_path: {out}/traces.db" in card  # resolved


def test_progress_is_drawn_live_and_each_group_reported(full_run):
    _, _, screen = full_run
    assert "sft rollouts" in screen and "RUNNING" in screen  # the LiveProgress stage table
    assert "group 3/3" in screen and "total 4/6 (67%)" in screen


def test_exported_forms_load_with_datasets_and_hold_no_rejected_attempt(full_run):
    out, _, _ = full_run
    rejected = {a["rollout_id"] for a in logged_attempts(out) if a["reason"] != "accepted"}
    accepted = {a["rollout_id"] for a in logged_attempts(out) if a["reason"] == "accepted"}
    assert len(rejected) == GROUP_SIZE and len(accepted) == len(SOLVED) * GROUP_SIZE
    for name in ("chat", "tokens"):
        as_json, as_parquet = load(out, name, "json"), load(out, name, "parquet")
        assert as_json.to_list() == as_parquet.to_list()
        assert {r["rollout_id"] for r in as_parquet} == accepted
        assert {r["task_id"] for r in as_parquet} == SOLVED
        assert all(r["reward"] == 1.0 for r in as_parquet)
    by_dir = datasets.load_dataset(str(out), "chat", split="train")  # the card's configs
    assert len(by_dir) == len(accepted)


def test_chat_form_is_the_conversation_with_parsed_tool_calls(full_run, tiny_model_dir):
    out, _, _ = full_run
    chat = load(out, "chat", "parquet")
    tasks = {t.instance_id: t for t in load_suite()}
    for ex in chat:
        roles = [m["role"] for m in ex["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        call = ex["messages"][2]["tool_calls"][0]
        assert call["function"]["name"] == "bash"
        assert call["function"]["arguments"] == {
            "command": f"git apply <<'PATCH'\n{tasks[ex['task_id']].patch}PATCH"
        }
        assert ex["messages"][3]["tool_call_id"] == call["id"]
        assert ex["messages"][3]["content"].startswith("exit code: 0")
        assert ex["messages"][-1] == {"role": "assistant", "content": "Done."}  # read from the sampled ids
        assert ex["tools"] == [{**t, "function": {**t["function"]}} for t in TOOLS]
    # what TRL does with a row: render it with the model's chat template
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    text = tok.apply_chat_template(chat[0]["messages"], tools=chat[0]["tools"], tokenize=False)
    assert "git apply" in text and text.rstrip().endswith("Done.<|im_end|>")


def test_token_form_is_what_the_trace_store_recorded(full_run):
    out, _, _ = full_run
    tokens = load(out, "tokens", "parquet")
    assert len(tokens) > 0
    for ex in tokens:
        records = {r.call_index: r for r in read_records(out / "traces.db", ex["session_id"])}
        calls = [records[i] for i in ex["call_indices"]]
        last = calls[-1]
        assert ex["input_ids"] == list(last.prompt_ids) + list(last.response_ids)
        sampled = set()
        for rec in calls:
            start = len(rec.prompt_ids)
            assert ex["input_ids"][start : start + len(rec.response_ids)] == list(rec.response_ids)
            sampled.update(range(start, start + len(rec.response_ids)))
        assert [i for i, m in enumerate(ex["loss_mask"]) if m] == sorted(sampled)


def content(ds: datasets.Dataset, key: str) -> list[tuple[str, str]]:
    """What an example holds, without its run-specific ids (tool call ids are random per call)."""
    text = (json.dumps(r[key]) for r in ds)
    return sorted(
        (r["task_id"], re.sub(r"chatcmpl-tool-[0-9a-f]+", "<id>", t)) for r, t in zip(ds, text, strict=True)
    )


class Interrupt(RuntimeError):
    pass


def test_an_interrupted_run_resumes_to_the_same_set(full_run, upstream, tiny_model_dir, tmp_path):
    out = tmp_path / "sft"
    seen: list[int] = []

    def crash_after_first_accepted(group: dict) -> None:
        seen.append(group["seq"])
        if any(a["reason"] == "accepted" for a in group["attempts"]):
            raise Interrupt("killed after the first accepted group")

    with pytest.raises(Interrupt):
        generate(sft_cfg(upstream, out, tiny_model_dir), on_group=crash_after_first_accepted)
    first = [json.loads(line)["seq"] for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert first == seen and len(first) < len(TASKS)
    stats = generate(sft_cfg(upstream, out, tiny_model_dir))
    seqs = [json.loads(line)["seq"] for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(seqs) == list(range(len(TASKS)))  # nothing run twice, nothing lost
    full_out, full_stats, _ = full_run
    for key in ("attempts", "accepted", "rejected", "token_rows", "tokens", "trainable_tokens"):
        assert stats[key] == full_stats[key], key
    for name in ("chat", "tokens"):
        resumed, full = load(out, name, "parquet"), load(full_out, name, "parquet")
        assert len(set(resumed["rollout_id"])) == len(set(full["rollout_id"]))  # no duplicates
        key = "messages" if name == "chat" else "input_ids"
        assert content(resumed, key) == content(full, key)


def test_command_line_stops_at_max_groups_and_resumes(upstream, tiny_model_dir, tmp_path):
    out = tmp_path / "cli"
    base = [sys.executable, "-m", "polar_pl.sft", f"model_dir={tiny_model_dir}", "engine=vllm",
            f"engine.url={upstream.url}", "task.instance_ids=[calc-1,strkit-1]", "datamodule.group_size=1",
            "harness.max_tokens=null", *SCRIPTED_GATEWAY,
            f"sft.output_dir={out}"]  # fmt: skip

    def run(*extra: str) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [*base, *extra], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0, p.stderr[-3000:]
        return p

    first = run("sft.max_groups=1")
    assert "group 1/2 calc-1: 1/1 accepted" in first.stdout
    assert json.loads((out / "stats.json").read_text())["complete"] is False
    second = run()
    assert "resuming" in second.stdout and "group 2/2 strkit-1: 0/1 accepted" in second.stdout
    assert "sft: 1/2 attempts accepted (50.0%)" in second.stdout
    stats = json.loads((out / "stats.json").read_text())
    assert stats["complete"] and stats["attempts"] == 2 and stats["accepted"] == 1
    assert len(load(out, "tokens", "json")) >= 1 and len(load(out, "chat", "json")) == 1
    assert len(list((out / "runs").iterdir())) == 2  # each invocation's Hydra run directory
