"""GRPOModule._optimise's bookkeeping on the small model: which sequences each optimiser step
trains, in which order, which minibatches are skipped, and the timing / counter metrics."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
import torch
from small_model import small_model
from synthetic import row

from polar_pl.datamodule.collate import collate
from polar_pl.module import losses, offpolicy
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.segments import call_segments
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import EmbeddedStateDictSync, hf_state_dict, nbytes

# One row per sequence (mode "pad"); row i trains i + 1 tokens, so a micro-batch's mask row sums
# name its sequences. Rewards differ: no group is filtered.
ROWS = [row(f"r{i}", "g", float(i), [(1, 2 + i)], 8) for i in range(6)]


class Seen:
    """The default clipped loss, recording the trainable-token count of each sequence it is given;
    clip_all: report every token clipped; off_mask: the per-token value at untrained tokens."""

    def __init__(self, clip_all: bool = False, off_mask: float | None = None):
        self.calls: list[list[int]] = []
        self.clip_all, self.off_mask = clip_all, off_mask

    def __call__(self, logp, old, adv, mask, segments):
        self.calls.append([int(c) for c in mask.sum(1)])
        per_token, clipped = losses.clipped_policy_loss(
            logp, old, adv, mask, segments, eps_low=0.2, eps_high=0.28
        )
        if self.off_mask is not None:
            per_token = torch.where(mask > 0, per_token, self.off_mask)
        return per_token, (mask if self.clip_all else clipped)


def module(seen: Seen, weight_sync=None, **kw) -> GRPOModule:
    settings = GRPOSettings(policy_loss=seen, filter_zero_variance=False, lr=1e-3, **kw)
    return GRPOModule(model=small_model(), settings=settings, weight_sync=weight_sync)


def counts(order: torch.Tensor) -> list[int]:
    return [int(i) + 1 for i in order]


def test_minibatches_follow_the_seeded_permutation_of_each_batch() -> None:
    """The shuffle is seeded by seed + optimizer_steps (reproducible, and not the global RNG)."""
    seen = Seen()
    mod = module(seen, minibatches=2, seed=3)
    opt = mod.configure_optimizers()
    torch.manual_seed(11)  # the global RNG must not matter
    mod.update(collate(ROWS, mode="pad"), opt)
    mod.update(collate(ROWS, mode="pad"), opt)
    expected = []
    for seed in (3, 5):  # the second batch starts after 2 optimiser steps
        order = torch.randperm(6, generator=torch.Generator().manual_seed(seed))
        expected += [counts(mb) for mb in torch.tensor_split(order, 2)]
    assert seen.calls == expected


def test_one_minibatch_keeps_the_batch_order() -> None:
    seen = Seen()
    mod = module(seen, micro_batch_size=2)
    m = mod.update(collate(ROWS, mode="pad"), mod.configure_optimizers())
    assert seen.calls == [[1, 2], [3, 4], [5, 6]]
    assert m["train/filtered_groups_frac"] == 0.0  # no filter


def test_minibatches_without_trainable_tokens_take_no_step() -> None:
    """Group b (one rollout) is filtered: its minibatch is skipped, not stepped with no gradient."""
    rows = [
        row("a0", "a", 1.0, [(1, 3)], 5),
        row("a1", "a", 0.0, [(1, 4)], 5),
        row("b0", "b", 1.0, [(1, 3)], 5),
    ]
    mod = GRPOModule(model=small_model(), settings=GRPOSettings(minibatches=3, lr=1e-3))
    m = mod.update(collate(rows, mode="pad"), mod.configure_optimizers())
    assert m["train/optimizer_steps"] == 2.0 and mod.optimizer_steps == 2
    assert m["train/filtered_groups_frac"] == 0.5


def test_push_time_is_zero_without_a_weight_sync() -> None:
    mod = module(Seen())
    m = mod.update(collate(ROWS, mode="pad"), mod.configure_optimizers())
    assert 0.0 <= m["train/push_s"] < 0.5 and mod.own_version == 1
    mod = module(Seen(), push_every=2)  # a step that does not push takes no push time
    m = mod.update(collate(ROWS, mode="pad"), mod.configure_optimizers())
    assert 0.0 <= m["train/push_s"] < 0.5 and mod.own_version == 0


def test_gradients_are_clipped_to_grad_clip() -> None:
    """The step applies the clipped gradient; train/grad_norm reports the norm before clipping."""
    g, m = grads_of(module(Seen(), grad_clip=1e-3))
    assert float(g.norm()) == pytest.approx(1e-3, rel=1e-4) and m["train/grad_norm"] > 2e-3
    g, m = grads_of(module(Seen(), grad_clip=None))
    assert float(g.norm()) == pytest.approx(m["train/grad_norm"], rel=1e-5)


def test_micro_batches_by_tokens() -> None:
    seen = Seen()
    mod = module(seen, micro_batch_tokens=20)  # 8-token sequences: two a micro-batch
    mod.update(collate(ROWS, mode="pad"), mod.configure_optimizers())
    assert seen.calls == [[1, 2], [3, 4], [5, 6]]
    seen = Seen()
    mod = module(seen, micro_batch_tokens=4)  # under one sequence: still one sequence a micro-batch
    mod.update(collate(ROWS, mode="pad"), mod.configure_optimizers())
    assert seen.calls == [[1], [2], [3], [4], [5], [6]]


class Sleepy:
    """Stands in for the engine (not under test): each push takes 50 ms."""

    def __init__(self):
        self.pushed = 0

    def update_weights_from_state_dict(self, state) -> int:
        time.sleep(0.05)
        self.pushed += 1
        return self.pushed

    def policy_version(self) -> int:
        return self.pushed


def test_push_time_sums_every_push() -> None:
    engine = Sleepy()
    mod = module(Seen(), minibatches=2, weight_sync=EmbeddedStateDictSync(engine))
    m = mod.update(collate(ROWS, mode="pad"), mod.configure_optimizers())
    assert engine.pushed == 2 and 0.1 <= m["train/push_s"] < 5.0
    assert m["train/push_mb"] == pytest.approx(2 * nbytes(hf_state_dict(mod.model)) / 1e6)
    assert m["train/policy_version"] == 2.0


def independent_logprobs(model, batch, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) float64 logprob of each token and entropy of its distribution (one row per
    sequence, no top-k / top-p), straight from the HF forward."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits.double()[:, :-1] / temperature
    lp_all = torch.log_softmax(logits, -1)
    lp = lp_all.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    ent = -(lp_all.exp() * lp_all).sum(-1)
    return torch.nn.functional.pad(lp, (1, 0)), torch.nn.functional.pad(ent, (1, 0))


@pytest.mark.parametrize(("minibatches", "epochs"), [(1, 1), (2, 2)])
def test_update_metrics_by_hand(minibatches, epochs) -> None:
    """lr 0: every step sees the initial weights, so pi_old is the policy (ratio 1) and the
    metrics are token means over the batch, whatever the minibatching (train/loss and train/kl
    are means over optimiser steps of steps that each carry their share at full scale). The rows
    record no sampling settings: they were sampled at module.temperature."""
    rows = [row(f"r{i}", "g", float(i), [(1, 2 + i)], 8, behavior=-1.0, version=1) for i in range(6)]
    batch = collate(rows, mode="pad")
    mod = GRPOModule(
        model=small_model(),
        settings=GRPOSettings(
            kl=losses.kl_k2,
            kl_coef=0.1,
            entropy_coef=0.01,
            minibatches=minibatches,
            epochs=epochs,
            grad_clip=None,
            temperature=0.7,
        ),
    )
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # move the policy off the frozen reference: KL > 0
        for p in mod.model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    mod.own_version = 3
    opt = torch.optim.SGD(mod.model.parameters(), lr=0.0)
    norms = []
    opt.register_step_pre_hook(
        lambda *_: norms.append(float(torch.cat([p.grad.flatten() for p in mod.model.parameters()]).norm()))
    )
    m = mod.update(batch, opt)

    mask = batch.loss_mask.double()
    lp, ent = independent_logprobs(mod.model, batch, 0.7)
    ref_lp, _ = independent_logprobs(small_model(), batch, 0.7)
    r = torch.arange(6, dtype=torch.float64)
    adv = ((r - r.mean()) / (r.std() + 1e-6))[:, None] * mask
    k2 = 0.5 * (lp - ref_lp) ** 2

    def token_mean(x):
        return float((x * mask).sum() / 21)

    assert set(m) == {
        "train/loss", "train/clip_frac", "train/kl", "train/grad_norm", "train/optimizer_steps", "train/push_s", "train/push_mb",
        "train/lr", "train/logprob_gap_mean", "train/ratio_p05", "train/ratio_p50", "train/ratio_p95",
        "train/staleness_mean", "train/staleness_max", "train/entropy", "train/advantage_abs_mean",
        "train/rollouts", "train/side_rollouts", "train/truncated_calls", "train/tokens_per_s",
        "train/old_logprob_s", "train/update_s", "train/filtered_groups_frac", "train/trainable_tokens",
        "train/skipped_batches", "train/policy_version", "train/kl_ref",
    }  # fmt: skip
    approx = functools.partial(pytest.approx, rel=1e-4, abs=1e-6)
    d = ref_lp - lp
    assert m["train/kl_ref"] == approx(token_mean(d.exp() - d - 1))  # pi_old's distance from the reference
    assert m["train/loss"] == approx(token_mean(-adv + 0.1 * k2 - 0.01 * ent))
    assert m["train/kl"] == approx(token_mean(k2)) and m["train/kl"] > 1e-3
    assert m["train/clip_frac"] == 0.0
    steps = minibatches * epochs
    assert len(norms) == steps and m["train/grad_norm"] == approx(sum(norms) / steps)
    assert m["train/optimizer_steps"] == float(steps) and m["train/lr"] == 0.0
    assert m["train/logprob_gap_mean"] == approx(float(((lp + 1.0).abs() * mask).sum() / 21))
    ratios = (lp + 1.0).exp()[mask > 0].numpy()
    for k, q in (("p05", 0.05), ("p50", 0.5), ("p95", 0.95)):
        assert m[f"train/ratio_{k}"] == approx(float(np.quantile(ratios, q)))
    assert m["train/entropy"] == approx(token_mean(ent))
    assert m["train/staleness_mean"] == 2.0 and m["train/staleness_max"] == 2.0
    assert m["train/advantage_abs_mean"] == approx(float(adv.abs().amax(1).mean()))
    assert (m["train/rollouts"], m["train/side_rollouts"], m["train/truncated_calls"]) == (6.0, 0.0, 0.0)
    assert (m["train/trainable_tokens"], m["train/filtered_groups_frac"]) == (21.0, 0.0)
    assert (m["train/skipped_batches"], m["train/policy_version"]) == (0.0, 3.0 + steps)
    # tokens_per_s is the batch's non-padding tokens over the time spent outside pushes
    assert m["train/old_logprob_s"] > 0 and m["train/update_s"] > 0
    seconds = m["train/old_logprob_s"] + m["train/update_s"]
    assert m["train/tokens_per_s"] * seconds == approx(48.0 * epochs)


class Ranks:
    """Stands in for a two-process Trainer (not under test): this process's rank, and a strategy
    that runs each backward here and sums the metric sums with the other rank's (`others`)."""

    def __init__(self, global_rank: int, others: torch.Tensor | None = None):
        self.world_size, self.global_rank, self.strategy = 2, global_rank, self
        self.others, self.backwards, self.reduced = others, 0, None

    def backward(self, loss, optimizer, *args, **kwargs) -> None:
        self.backwards += 1
        loss.backward()

    def reduce(self, sums: torch.Tensor, reduce_op: str) -> torch.Tensor:
        assert reduce_op == "sum"
        self.reduced = sums.clone()
        return sums + self.others if self.others is not None else sums


def grads_of(mod: GRPOModule, trainer=None) -> tuple[torch.Tensor, dict]:
    mod._trainer = trainer
    opt = torch.optim.SGD(mod.model.parameters(), lr=0.0)
    grads = []
    opt.register_step_pre_hook(
        lambda *_: grads.append(torch.cat([p.grad.flatten() for p in mod.model.parameters()]))
    )
    m = mod.update(collate(ROWS[:5], mode="pad"), opt)
    assert len(grads) == 1
    return grads[0], m


def test_two_ranks_average_to_the_one_process_gradient() -> None:
    """5 micro-batches over 2 ranks: rank 0 trains 3, rank 1 trains 2 and pads one empty
    backward; the strategy averages the gradients, so each rank scales its loss by 2."""
    one, m_one = grads_of(module(Seen(), micro_batch_size=1, grad_clip=None))
    r1 = Ranks(1)
    g1, _ = grads_of(module(Seen(), micro_batch_size=1, grad_clip=None), r1)
    r0 = Ranks(0, others=r1.reduced)
    g0, m0 = grads_of(module(Seen(), micro_batch_size=1, grad_clip=None), r0)
    assert r0.backwards == 3 and r1.backwards == 3
    assert not torch.allclose(g0, g1)
    assert torch.allclose((g0 + g1) / 2, one, atol=1e-6, rtol=1e-5)
    for k in ("train/loss", "train/clip_frac", "train/kl"):
        assert m0[k] == pytest.approx(m_one[k], rel=1e-5, abs=1e-7)


def test_gspo_micro_batches_see_their_own_segments() -> None:
    """A micro-batch's sequence-level ratio uses the segments of its own sequences."""
    gspo = functools.partial(losses.gspo_policy_loss, eps_low=3e-4, eps_high=4e-4)
    full, _ = grads_of(
        GRPOModule(model=small_model(), settings=GRPOSettings(policy_loss=gspo, filter_zero_variance=False))
    )
    micro, _ = grads_of(
        GRPOModule(
            model=small_model(),
            settings=GRPOSettings(policy_loss=gspo, filter_zero_variance=False, micro_batch_size=1),
        )
    )
    assert full.abs().sum() > 0 and torch.allclose(micro, full, atol=1e-6, rtol=1e-5)


def test_clip_frac_is_clipped_over_trained_tokens_of_every_micro_batch() -> None:
    mod = module(Seen(clip_all=True), micro_batch_size=1)
    assert mod.update(collate(ROWS, mode="pad"), mod.configure_optimizers())["train/clip_frac"] == 1.0
    one = [row("a0", "a", 1.0, [(1, 2)], 4), row("a1", "a", 0.0, [], 4)]  # a single trained token
    mod = module(Seen(clip_all=True))
    assert mod.update(collate(one, mode="pad"), mod.configure_optimizers())["train/clip_frac"] == 1.0


def test_untrained_tokens_never_reach_the_loss() -> None:
    """Whatever a policy loss computes off the mask (nan included) weighs nothing."""
    base, m_base = grads_of(module(Seen(), micro_batch_size=2))
    for value in (float("nan"), 5.0):
        g, m = grads_of(module(Seen(off_mask=value), micro_batch_size=2))
        assert torch.equal(g, base) and m["train/loss"] == m_base["train/loss"]


def test_off_policy_weights_see_segments_and_advantages() -> None:
    """Sequence-level TIS needs the call segments, the DeepSeek mask the advantages: the logged
    means are those of the weights computed from the batch's own pi_old."""
    rows = [row(f"r{i}", "g", float(i), [(1, 2 + i)], 8, behavior=-1.0) for i in range(6)]
    batch = collate(rows, mode="pad")
    tis = functools.partial(offpolicy.tis_sequence, cap=2.0, length_norm=True)
    mask_kl = functools.partial(offpolicy.mask_sequence_kl, delta=0.5)
    mod = GRPOModule(model=small_model(), settings=GRPOSettings(tis=tis, off_policy_mask=mask_kl))
    m = mod.update(batch, torch.optim.SGD(mod.model.parameters(), lr=0.0))
    lp, _ = independent_logprobs(small_model(), batch)
    mask = batch.loss_mask.float()
    segments = call_segments(batch.loss_mask, batch.row_index, batch.position_ids, batch.row_meta)
    r = torch.arange(6, dtype=torch.float64)
    adv = (((r - r.mean()) / (r.std() + 1e-6))[:, None] * mask).float()
    tis_w = tis(lp.float(), batch.behavior_logprobs, mask, segments, adv)
    keep_w = mask_kl(lp.float(), batch.behavior_logprobs, mask, segments, adv)
    assert m["train/tis_weight_mean"] == pytest.approx(float((tis_w * mask).sum() / 21), rel=1e-4)
    assert m["train/off_policy_masked_frac"] == pytest.approx(6 / 21)  # the 3 negative-advantage rows
    assert float((keep_w * mask).sum()) == 15.0


def test_tokens_per_second_counts_non_padding_tokens() -> None:
    rows = [*ROWS, row("short", "g", 2.5, [(1, 3)], 5)]  # pad mode: 3 padding tokens
    batch = collate(rows, mode="pad")
    assert (batch.total_tokens, batch.padding_tokens) == (56, 3)
    mod = module(Seen())
    m = mod.update(batch, mod.configure_optimizers())
    seconds = m["train/old_logprob_s"] + m["train/update_s"]
    assert m["train/tokens_per_s"] * seconds == pytest.approx(53.0, rel=1e-6)
