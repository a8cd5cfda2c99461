"""The trainer-versus-engine logprob gap on calls sampled through the real gateway (test kit).

Sessions on a gateway in front of an engine each make one chat call with the given sampling
settings (OpenAI SDK); the records go through the `per_request` builder and one
`GRPOModule.update` from the weights the engine serves, whose `train/logprob_gap_mean` compares
the trainer's pi_old with the engine's behaviour logprobs on every sampled token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import torch

from polar_pl.datamodule.collate import collate
from polar_pl.gateway.handle import Gateway
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings
from polar_pl.trajectory import PerRequestBuilder

PROMPTS = ("Tell me about rivers.", "Write a word in CAPITALS.", "Count to five.", "Name a colour.")


def sample_records(
    engine: Any,
    store: Path,
    tokenizer_dir: Path,
    *,
    sampling: str = "recorded",
    max_tokens: int = 12,
    **params: Any,
) -> list[list]:
    """One session per prompt x 2 attempts; `params` (temperature, top_p, ...) go to every call.
    Returns each session's records."""
    out = []
    with Gateway([engine.url], store, tokenizer_dir=tokenizer_dir, sampling=sampling) as gw:
        for k in range(2 * len(PROMPTS)):
            s = gw.create_session(group_id=f"g{k % len(PROMPTS)}", rollout_id=f"r{k}")
            client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
            client.chat.completions.create(
                model=engine.model,
                messages=[{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}],
                max_tokens=max_tokens,
                **params,
            )
            out.append(gw.records(s.session_id))
    return out


def trainer_gap(
    model_dir: Path, sessions: list[list], settings: GRPOSettings = GRPOSettings()
) -> dict[str, float]:
    """train/* metrics of one update (lr 0) on the sampled rows; every group has a 0 and a 1 reward."""
    builder = PerRequestBuilder()
    half = len(sessions) // 2  # attempt 1 of every prompt scores 0, attempt 2 scores 1
    rows = [
        row for k, recs in enumerate(sessions) for row in builder.build(recs, reward=float(k >= half)).rows
    ]
    module = GRPOModule(model_dir, settings=settings)
    budget = max(len(r.input_ids) for r in rows)
    return module.update(
        collate(rows, token_budget=budget), torch.optim.SGD(module.model.parameters(), lr=0.0)
    )
