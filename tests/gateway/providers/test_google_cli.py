"""Real CLIs that speak Gemini generateContent (Gemini CLI, pi) with thinking: see thinking_cli.py.
Gemini CLI keeps thought parts out of its history; the reasoning must come back from the
thoughtSignature on the parts it keeps."""

from __future__ import annotations

import pytest
from thinking_cli import run_thinking_task, thinking_stack


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    with thinking_stack(tiny_model_dir, tmp_path_factory.mktemp("gateway") / "traces.db") as s:
        yield s


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemini_cli", "pi"])
def test_cli_thinking_tool_task_stays_prefix_mergeable(stack, name):
    first, second = run_thinking_task(stack, name, "google")
    assert first.provider == "google" and first.path.endswith(":streamGenerateContent")
    if name == "gemini_cli":
        turn = next(c for c in second.raw_request["contents"] if c["role"] == "model")
        assert not any(p.get("thought") for p in turn["parts"]), "Gemini CLI dropped the thoughts"
        assert any("thoughtSignature" in p for p in turn["parts"])
