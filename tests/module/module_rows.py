"""Rows sampled from a real engine for the module tests."""

from __future__ import annotations

import httpx
import torch

from polar_pl.trajectory.rows import TrajectoryRow


def sample_group(
    engine,
    group: str,
    prompt: list[int],
    *,
    size: int = 4,
    max_tokens: int = 6,
    seed: int = 0,
    rewards: list[float] | None = None,
    harness: str = "mini",
) -> list[TrajectoryRow]:
    """`size` completions of one prompt (temperature 1) as rows: prompt masked, sampled tokens
    trainable with the engine's logprobs and policy version. Reward i defaults to i % 2."""
    body = {
        "model": engine.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "n": size,
        "seed": seed, "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
    }  # fmt: skip
    r = httpx.post(f"{engine.base_url}/completions", json=body, timeout=120)
    r.raise_for_status()
    out = r.json()
    # vLLM tags no answer with a version: the handle knows it.
    version = int(r.headers.get("x-policy-version", engine.policy_version()))
    rows = []
    for i, choice in enumerate(sorted(out["choices"], key=lambda c: c["index"])):
        ids, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        p = len(prompt)
        rows.append(
            TrajectoryRow(
                input_ids=prompt + ids,
                loss_mask=[0] * p + [1] * len(ids),
                behavior_logprobs=[0.0] * p + [float(x) for x in lps],
                policy_version=[-1] * p + [version] * len(ids),
                session_id=f"{group}-s{i}",
                rollout_id=f"{group}-r{i}",
                group_id=group,
                reward=rewards[i] if rewards is not None else float(i % 2),
                harness=harness,
            )
        )
    return rows


def prompt_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 8000, (n,), generator=g).tolist()
