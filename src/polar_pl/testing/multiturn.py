"""A multi-turn GRPO loop over the real gateway, without sandboxes (test kit).

Every session is the mini agent's note-taking loop (`mini_agent.run_notes`: a title side call,
two note turns answered by observations that restate the task, the answer) run in-process
against a real gateway session in front of the engine; the records go through the prefix builder
(one merged main row with masked observation turns, one side row), `GRPOModule.update` trains on
them and the weight sync pushes. What `python train.py experiment=multiturn` does, minus the
sandbox and process start of each attempt (about a second of CPU each on the CPU default), so a
learning test fits in CI.
"""

from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import torch

from polar_pl.datamodule.collate import collate
from polar_pl.gateway.handle import Gateway
from polar_pl.harness.mini_agent import run_notes
from polar_pl.module.grpo import GRPOModule
from polar_pl.tasks.answer import score_answer
from polar_pl.trajectory import PrefixBuilder


@dataclass
class Curves:
    """Per step: mean reward, mean reward per answer check, trainer metrics; per session the
    call kinds and the number of rows it became."""

    reward: list[float] = field(default_factory=list)
    by_check: dict[str, list[float]] = field(default_factory=dict)
    entropy: list[float] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    rows_per_session: list[int] = field(default_factory=list)
    side_rollouts: list[float] = field(default_factory=list)
    sample_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)


def session(gw: Gateway, model: str, task: Any, group: str, k: int, **notes: Any) -> tuple[list, float]:
    s = gw.create_session(group_id=group, rollout_id=f"{group}-r{k}", task_id=task.instance_id)
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=2)  # token in the URL
    _, answer = run_notes(task.prompt, model, client=client, **notes)
    return gw.records(s.session_id), score_answer(task, answer)


def learn(
    module: GRPOModule,
    engine: Any,
    tasks: list[Any],
    store: Path,
    *,
    steps: int,
    group_size: int,
    groups_per_step: int,
    notes: dict[str, Any],
    seed: int | None = None,
) -> Curves:
    """`steps` GRPO steps, each on `groups_per_step` groups of `group_size` sessions; task
    `step * groups_per_step + g` (cyclic) for group g. With `seed`, every session samples with its
    own seed drawn from (seed, step, group, attempt): a run is then repeatable."""
    out = Curves()
    builder = PrefixBuilder()
    opt = module.configure_optimizers()
    assert isinstance(opt, torch.optim.Optimizer)  # a module without lr_scheduler: no config dict
    with Gateway([engine.url], store, tokenizer_dir=engine.model_dir) as gw, ThreadPoolExecutor(16) as pool:
        for step in range(steps):
            t0, jobs = time.perf_counter(), []
            for g in range(groups_per_step):
                task = tasks[(step * groups_per_step + g) % len(tasks)]
                for k in range(group_size):
                    kw = notes
                    if seed is not None:
                        sampling_seed = random.Random(f"{seed}-{step}-{g}-{k}").getrandbits(31)
                        kw = {**notes, "extra": {**notes.get("extra", {}), "seed": sampling_seed}}
                    jobs.append((task, pool.submit(session, gw, engine.model, task, f"s{step}g{g}", k, **kw)))
            rows, rewards = [], []
            per_check: dict[str, list[float]] = {}
            for task, fut in jobs:
                records, reward = fut.result()
                built = builder.build(records, reward=reward, harness="mini").rows
                rows += built
                rewards.append(reward)
                per_check.setdefault(task.answer_check.kind, []).append(reward)
                out.calls.append([r.call_kind for r in records])
                out.rows_per_session.append(len(built))
            t1 = time.perf_counter()
            m = module.update(collate(rows, token_budget=max(len(r.input_ids) for r in rows)), opt)
            out.sample_s.append(t1 - t0)
            out.update_s.append(time.perf_counter() - t1)
            out.reward.append(statistics.mean(rewards))
            for check, values in per_check.items():
                out.by_check.setdefault(check, []).append(statistics.mean(values))
            out.entropy.append(m.get("train/entropy", float("nan")))
            out.side_rollouts.append(m.get("train/side_rollouts", 0.0))
    return out
