"""SmolLM2-135M-Instruct through the trainer and both engines: the trainer's logprobs of what an
engine sampled equal the engine's (fresh gap < 0.01), a GRPO step pushed into the embedded engine
(in memory) and into vLLM's CPU build (safetensors from disk) is what they then serve, and vLLM and
the embedded engine render, sample and score the same chat request alike."""

from __future__ import annotations

import httpx
import pytest
from module_rows import sample_group
from test_weight_sync import GAP_TOL, max_gap
from transformers import AutoTokenizer

from polar_pl.chat.render import render_chat
from polar_pl.datamodule.collate import collate
from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.vllm_engine import VLLMEngine, vllm_installed, vllm_python
from polar_pl.harness.mini_agent import TOOLS
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import DiskSync, EmbeddedStateDictSync

pytestmark = pytest.mark.slow
needs_vllm = pytest.mark.skipif(not vllm_installed(), reason=f"no vLLM CPU build at {vllm_python()}")
QUESTION = [{"role": "user", "content": "What is 17 plus 25?"}]


@pytest.fixture(scope="module")
def prompt(smollm2_model_dir) -> list[int]:
    return render_chat(AutoTokenizer.from_pretrained(str(smollm2_model_dir)), QUESTION)[1]


def one_step(model_dir, engine, prompt, sync) -> GRPOModule:
    """A GRPO step on a group the engine sampled (lr large enough that its answers move), pushed."""
    module = GRPOModule(model_dir, weight_sync=sync, settings=GRPOSettings(lr=1e-4))
    rows = sample_group(engine, "g", prompt, size=4, max_tokens=8, seed=3)
    assert max_gap(module, rows) < GAP_TOL  # fresh: the trainer scores the engine's samples alike
    metrics = module.update(collate(rows, token_budget=256), module.configure_optimizers())
    assert metrics["train/optimizer_steps"] == 1.0 and metrics["train/logprob_gap_mean"] < GAP_TOL
    return module


def test_grpo_step_pushed_into_the_embedded_engine(smollm2_model_dir, prompt) -> None:
    with EmbeddedEngine(smollm2_model_dir, served_model_name="smollm2", max_model_len=1024) as engine:
        module = one_step(smollm2_model_dir, engine, prompt, EmbeddedStateDictSync().bind(engine))
        assert engine.policy_version() == 1
        rows = sample_group(engine, "after", prompt, size=4, max_tokens=8, seed=9)
    assert max_gap(module, rows) < GAP_TOL
    assert max_gap(GRPOModule(smollm2_model_dir), rows) > GAP_TOL  # the engine serves the new weights


@needs_vllm
def test_vllm_and_embedded_agree_then_a_disk_push_reaches_vllm(smollm2_model_dir, prompt) -> None:
    request = {"model": "smollm2", "messages": [{"role": "system", "content": "You are a coding agent."},
               *QUESTION], "tools": TOOLS, "temperature": 0, "max_tokens": 16, "logprobs": True,
               "top_logprobs": 0, "return_token_ids": True}  # fmt: skip
    with (
        VLLMEngine(smollm2_model_dir, served_model_name="smollm2", max_model_len=2048) as vllm,
        EmbeddedEngine(smollm2_model_dir, served_model_name="smollm2", max_model_len=2048) as embedded,
    ):
        ours, ref = (httpx.post(f"{e.base_url}/chat/completions", json=request, timeout=300).json()
                     for e in (embedded, vllm))  # fmt: skip
        assert ours["prompt_token_ids"] == ref["prompt_token_ids"]  # the template with tools, alike
        a, b = ours["choices"][0], ref["choices"][0]
        same = next(
            (i for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"], strict=False)) if x != y),
            len(a["token_ids"]),
        )
        assert same >= 8, (a["token_ids"], b["token_ids"])  # greedy ties may part them later, not at once
        gaps = [abs(x["logprob"] - y["logprob"])
                for x, y in zip(a["logprobs"]["content"][:same], b["logprobs"]["content"][:same], strict=False)]  # fmt: skip
        assert max(gaps) < GAP_TOL
        module = one_step(smollm2_model_dir, vllm, prompt, DiskSync().bind(vllm))
        assert vllm.policy_version() == 1
        rows = sample_group(vllm, "after", prompt, size=4, max_tokens=8, seed=9)
    assert max_gap(module, rows) < GAP_TOL
    assert max_gap(GRPOModule(smollm2_model_dir), rows) > GAP_TOL
