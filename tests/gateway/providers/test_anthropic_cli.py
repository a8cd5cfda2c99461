"""Real CLIs that speak Anthropic Messages (Claude Code, pi, Qwen Code) with thinking: see
thinking_cli.py. Claude Code asks for `thinking.display: "omitted"`, so it only ever holds the
gateway's signature, and the reasoning must come back from it."""

from __future__ import annotations

import pytest
from thinking_cli import run_thinking_task, thinking_stack


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    with thinking_stack(tiny_model_dir, tmp_path_factory.mktemp("gateway") / "traces.db") as s:
        yield s


@pytest.mark.slow
@pytest.mark.parametrize("name", ["claude_code", "pi", "qwen_code"])
def test_cli_thinking_tool_task_stays_prefix_mergeable(stack, name):
    first, _ = run_thinking_task(stack, name, "anthropic")
    assert first.provider == "anthropic"
    if name == "claude_code":
        assert first.raw_request["thinking"].get("display") == "omitted"
