"""Property tests: GRPOModule.update on random batches (ragged rows, rollouts split into chains,
side rows, unequal groups, per-call sampling settings, packed several rows to a sequence) moves
the weights exactly as an independent per-row reference (reference.py) says it should."""

from __future__ import annotations

import copy
import functools
import os

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from reference import RefConfig, loss
from small_model import VOCAB, small_model
from synthetic import row

from polar_pl.datamodule.collate import collate
from polar_pl.module import advantages, aggregation, losses, offpolicy
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings

# No shrinking: a failing example is printed whole, and shrinking one costs minutes. Mutation runs
# (pyproject's [tool.mutmut]) set POLAR_HYPOTHESIS_EXAMPLES for fewer, fixed examples.
EXAMPLES = os.environ.get("POLAR_HYPOTHESIS_EXAMPLES")
SETTINGS = settings(
    max_examples=int(EXAMPLES or 20),
    derandomize=EXAMPLES is not None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
SAMPLING = st.sampled_from(
    [{}, {"temperature": 0.7}, {"temperature": 1.3, "top_k": 6}, {"temperature": 0.8, "top_p": 0.7}]
)


@st.composite
def rows(draw):
    """Groups of 1-4 rollouts, each 1-2 chains of 1-3 calls, some with a side row."""
    out = []
    for g in range(draw(st.integers(1, 3))):
        for k in range(draw(st.integers(1, 4))):
            rid = f"g{g}r{k}"
            reward = draw(st.sampled_from([0.0, 0.5, 1.0]))
            chains = draw(st.integers(1, 2))
            for c in range(chains + int(draw(st.booleans()))):
                side = c == chains
                spans, pos = [], draw(st.integers(1, 3))
                for _ in range(1 if side else draw(st.integers(1, 3))):
                    n = draw(st.integers(1, 4))
                    spans.append((pos, pos + n))
                    pos += n + draw(st.integers(1, 2))
                ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=pos, max_size=pos))
                beh = draw(st.lists(st.floats(-3.0, -0.05), min_size=pos, max_size=pos))
                samp = [draw(SAMPLING) for _ in spans]
                r = draw(st.sampled_from([0.0, 1.0])) if side else reward
                out.append(row(rid, f"g{g}", r, spans, pos, side=side, ids=ids, behavior=beh, sampling=samp))
    return out


CONFIGS = st.builds(
    RefConfig,
    advantage=st.sampled_from(["group_mean", "group_mean_nostd", "leave_one_out"]),
    aggregation=st.sampled_from(["token_mean", "seq_mean_token_mean", "rollout_mean", "sum_norm"]),
    side_rows=st.sampled_from(["own", "exclude"]),
    filter_zero_variance=st.booleans(),
    tis_cap=st.sampled_from([None, 1.5]),
    kl_coef=st.sampled_from([0.0, 0.5]),
    entropy_coef=st.sampled_from([0.0, 0.05]),
)


def module_for(cfg: RefConfig, model, **kw) -> GRPOModule:
    adv = {
        "group_mean": functools.partial(advantages.group_mean, std_normalize=True),
        "group_mean_nostd": functools.partial(advantages.group_mean, std_normalize=False),
        "leave_one_out": advantages.leave_one_out,
    }[cfg.advantage]
    agg = {
        "token_mean": aggregation.token_mean,
        "seq_mean_token_mean": aggregation.seq_mean_token_mean,
        "rollout_mean": aggregation.rollout_mean,
        "sum_norm": functools.partial(aggregation.seq_mean_token_sum_norm, max_len=cfg.max_len),
    }[cfg.aggregation]
    return GRPOModule(
        model=model,
        settings=GRPOSettings(
            advantage=adv,
            aggregation=agg,
            side_rows=cfg.side_rows,
            filter_zero_variance=cfg.filter_zero_variance,
            grad_clip=None,
            tis=functools.partial(offpolicy.tis_token, cap=cfg.tis_cap) if cfg.tis_cap else None,
            kl=losses.kl_k2 if cfg.kl_coef else None,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
            policy_loss=functools.partial(
                losses.clipped_policy_loss, eps_low=cfg.eps_low, eps_high=cfg.eps_high
            ),
            **kw,
        ),
    )


def perturb(model, seed: int = 1) -> None:
    """Move the policy away from the reference, so KL has a gradient."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def reference_sgd(rows_, cfg: RefConfig, epochs: int, lr: float) -> torch.Tensor | None:
    """The reference's weights after `epochs` full-batch SGD steps (None: nothing to train)."""
    ref_model = small_model()
    model = copy.deepcopy(ref_model)
    perturb(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    old: dict = {}
    for _ in range(epochs):
        opt.zero_grad()
        value = loss(model, ref_model if cfg.kl_coef else None, rows_, old, cfg)
        if not value.requires_grad:
            return None
        value.backward()
        opt.step()
    return flat_params(model)


@SETTINGS
@given(rows=rows(), cfg=CONFIGS, epochs=st.integers(1, 2), budget=st.sampled_from([16, 40]))
def test_update_matches_per_row_reference(rows, cfg, epochs, budget) -> None:
    """Full-batch SGD for 1-2 epochs: the second epoch's ratio is against the first's weights."""
    expected = reference_sgd(rows, cfg, epochs, lr=0.5)
    module = module_for(cfg, small_model(), epochs=epochs)
    perturb(module.model)
    batch = collate(rows, token_budget=max(budget, *(len(r.input_ids) for r in rows)))
    m = module.update(batch, torch.optim.SGD(module.model.parameters(), lr=0.5))
    if expected is None:
        assert m.get("train/skipped") == 1.0
        return
    assert torch.allclose(flat_params(module.model), expected, atol=2e-5, rtol=1e-4)


class Recorder(torch.optim.Optimizer):
    """An optimizer that records each step's gradient and leaves the weights alone."""

    def __init__(self, params):
        super().__init__(list(params), {"lr": 0.0})
        self.grads: list[torch.Tensor] = []

    def step(self, closure=None):
        ps = [p for g in self.param_groups for p in g["params"]]
        self.grads.append(
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in ps])
        )


@SETTINGS
@given(rows=rows(), cfg=CONFIGS, minibatches=st.integers(2, 3), micro=st.sampled_from([None, 1]))
def test_minibatches_and_micro_batches_weigh_rollouts_as_the_whole_batch(
    rows, cfg, minibatches, micro
) -> None:
    """Weights are the whole batch's: over the minibatch steps the gradients average to the
    full-batch gradient, wherever a rollout's chains land (per-minibatch weights gave a split
    rollout 0.833 against its peers' 0.333)."""
    ref_model = small_model()
    model = copy.deepcopy(ref_model)
    perturb(model)
    value = loss(model, ref_model if cfg.kl_coef else None, rows, {}, cfg)
    module = module_for(cfg, small_model(), minibatches=minibatches, micro_batch_size=micro)
    perturb(module.model)
    opt = Recorder(module.model.parameters())
    module.update(collate(rows, token_budget=max(16, *(len(r.input_ids) for r in rows))), opt)
    if not value.requires_grad:
        assert opt.grads == []
        return
    value.backward()
    expected = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert 1 <= len(opt.grads) <= minibatches
    assert torch.allclose(torch.stack(opt.grads).mean(0), expected, atol=2e-5, rtol=1e-4)
