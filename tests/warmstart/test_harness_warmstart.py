"""The harness warm start's pieces: rows rendered exactly as the engine renders the request,
losses behind a no-grad prefix equal to a full forward, the shell tool read from schemas."""

from __future__ import annotations

import pytest
import torch
from harness_shapes import TOOLS, prompt
from transformers import AutoModelForCausalLM, AutoTokenizer

from polar_pl.chat.render import render_chat
from polar_pl.warmstart.harness_capture import HarnessPrompt
from polar_pl.warmstart.harness_conversations import examples, shell_tool
from polar_pl.warmstart.harness_data import (
    Group,
    compute_kvs,
    long_groups,
    render_tail,
    short_group,
    tail_tokens,
)
from polar_pl.warmstart.harness_warmstart import step_loss


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_shell_tool_and_its_required_arguments_come_from_the_schemas():
    tool = shell_tool(TOOLS)
    assert (tool.name, tool.command_arg, tool.extra) == (
        "bash",
        "command",
        {"description": "Write the answer file"},
    )
    with pytest.raises(ValueError, match="no shell tool"):
        shell_tool(TOOLS[1:])


def test_with_task_replaces_the_marker_and_the_workdir():
    msgs = prompt("env").with_task("Do X.", "/tmp/w2/workspace")
    assert "Do X." in msgs[1]["content"] and "/tmp/w2/workspace" in msgs[2]["content"]
    bare = HarnessPrompt("pi", "0", [{"role": "user", "content": "no marker"}], [], "/w")
    with pytest.raises(ValueError, match="task marker"):
        bare.with_task("Do X.")


def test_rows_are_the_engines_own_render_token_for_token(tok):
    """Tails are rendered in a stub conversation to stay cheap; the request plus its tail must be
    exactly what the engine renders for the whole conversation (tool result glue included)."""
    p = prompt()
    for ex in examples("pi", TOOLS, seed=3, count=12):
        msgs = p.with_task(ex.task)
        ctx_text, ctx_ids = render_chat(tok, msgs, TOOLS)
        tail, spans = render_tail(tok, ex)
        ids, labels = tail_tokens(tok, tail, spans)
        assert tok.encode(ctx_text + tail, add_special_tokens=False) == ctx_ids + ids
        history = msgs + [turn for kind, turn in ex.turns][:-1]
        if len(ex.turns) > 1:  # through the tool result, rendered the slow way
            slow, _ = render_chat(tok, history, TOOLS)
            assert (ctx_text + tail).startswith(slow)
        trained = tok.decode([t for t in labels if t != -100])
        assert trained.endswith("<|im_end|>") and "tool_response" not in trained


def test_modes_shared_when_the_task_is_last_per_task_when_a_block_follows(tok):
    shared = long_groups(tok, prompt(), seed=0, n_upper=2, per_task=2, shared_rows=20)
    assert len(shared) == 1 and shared[0].task is None and len(shared[0].rows) == 20
    per_task = long_groups(tok, prompt("environment " * 300), seed=0, n_upper=2, per_task=2, shared_rows=20)
    assert len(per_task) > 1 and all(g.task and len(g.rows) == 2 for g in per_task)
    # A segment's first token is predicted inside the prefix, so it can never be trained: in both
    # modes it is prompt, and the assistant's first token comes right after it.
    for g in [*shared, *per_task]:
        for ids, labels in g.rows:
            first = next(i for i, t in enumerate(labels) if t != -100)
            assert first >= 1 and tok.decode(g.prefix + ids[:first]).endswith("<|im_start|>assistant\n")
    assert short_group(tok, prompt(), seed=0, count=10).rows


def test_loss_behind_a_no_grad_prefix_equals_the_full_forward(tiny_model_dir, tok):
    """What makes long requests affordable must not change the objective."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    groups = [Group("long", list(range(100, 400))), Group("long", list(range(100, 350)) + [7] * 30)]
    rows = [([5, 6, 7, 8, 9, 10], [-100, 6, 7, 8, 9, 10]), ([11, 12, 13], [-100, 12, 13])]
    compute_kvs(model, groups, chunk=64)
    with torch.no_grad():
        for g in groups:
            fast = step_loss(model, g, rows, 0, 512, 1.0, torch.Generator().manual_seed(0))
            full = torch.tensor([g.prefix + ids + [0] * (6 - len(ids)) for ids, _ in rows])
            labels = torch.tensor([[-100] * len(g.prefix) + lab + [-100] * (6 - len(lab)) for _, lab in rows])
            logits = model(input_ids=full).logits[:, :-1]
            ref = torch.nn.functional.cross_entropy(
                logits[labels[:, 1:] != -100], labels[:, 1:][labels[:, 1:] != -100]
            )
            assert float(fast) == pytest.approx(float(ref), abs=1e-5)
