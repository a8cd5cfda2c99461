"""Shared-prefix (tree) training equals per-row training: the same per-token logprobs, GRPO loss
and gradient of every parameter (relative difference <= 1e-5 in fp32), on the tiny model and on
SmolLM2-135M, for single-call rows, several groups, prefix-merged multi-call rows and edge groups.

The per-row path is collate mode "pad": each row alone in its sequence, run causally."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_model import VOCAB, small_model
from synthetic import row

from polar_pl.datamodule.collate import TrainBatch, collate
from polar_pl.datamodule.tree import parents, root_path
from polar_pl.module import losses
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.logprobs import forward_inputs, token_logprobs
from polar_pl.module.settings import GRPOSettings
from polar_pl.trajectory.rows import TrajectoryRow

REL = 1e-5
SAMPLING = [{}, {"temperature": 0.7}, {"temperature": 1.3, "top_k": 6}, {"temperature": 0.8, "top_p": 0.7}]


def chain(rollout: str, group: str, reward: float, prompt: list[int], turns: list[tuple[list[int], list[int]]],
          *, sampling: list[dict] | None = None, side: bool = False) -> TrajectoryRow:  # fmt: skip
    """A prefix-merged row: the prompt, then per call its sampled response and the masked tokens
    that follow it (a tool result and the next turn's glue)."""
    ids, spans = list(prompt), []
    for response, after in turns:
        spans.append((len(ids), len(ids) + len(response)))
        ids += response + after
    return row(rollout, group, reward, spans, len(ids), ids=ids, side=side, sampling=sampling, behavior=-1.2)


def tokens(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=gen).tolist()


def single_call_group(gen, vocab, group="g", prompt_len=24, sizes=(3, 5, 1, 7)) -> list[TrajectoryRow]:
    """(a) One group, single-call rows of different lengths (one of a single sampled token)."""
    prompt = tokens(gen, prompt_len, vocab)
    return [
        chain(f"{group}r{k}", group, float(k % 2), prompt, [(tokens(gen, n, vocab), [])])
        for k, n in enumerate(sizes)
    ]


def multi_call_group(gen, vocab, group="m", prompt_len=20) -> list[TrajectoryRow]:
    """(c) Prefix-merged rows: 2-3 calls each, masked tool results between the sampled turns, per-call
    sampling settings; two rows start their first answer with the same token (the prefix must stop
    before it) and one rollout also has a side row of the same group."""
    prompt = tokens(gen, prompt_len, vocab)
    same = tokens(gen, 1, vocab)
    rows = []
    for k in range(3):
        turns = [((same if k < 2 else []) + tokens(gen, 2 + k, vocab), tokens(gen, 4, vocab))]
        turns += [(tokens(gen, 3, vocab), tokens(gen, 2 + k, vocab)) for _ in range(1 + k % 2)]
        turns.append((tokens(gen, 2, vocab), []))
        rows.append(
            chain(f"{group}r{k}", group, float(k == 1), prompt, turns, sampling=SAMPLING[: len(turns)])
        )
    rows.append(chain(f"{group}r0", group, 1.0, prompt[:12], [(tokens(gen, 3, vocab), [])], side=True))
    return rows


def edge_groups(gen, vocab) -> list[TrajectoryRow]:
    """(d) A row equal to the prefix plus one token, a group of one row, and a group whose rows
    share nothing."""
    prompt = tokens(gen, 10, vocab)
    return [
        chain("e0", "e", 1.0, prompt, [(tokens(gen, 1, vocab), [])]),
        chain("e1", "e", 0.0, prompt, [(tokens(gen, 6, vocab), tokens(gen, 2, vocab)), (tokens(gen, 2, vocab), [])]),
        chain("s0", "solo", 1.0, tokens(gen, 8, vocab), [(tokens(gen, 4, vocab), [])]),
        chain("n0", "apart", 1.0, [1] + tokens(gen, 5, vocab), [(tokens(gen, 3, vocab), [])]),
        chain("n1", "apart", 0.0, [2] + tokens(gen, 5, vocab), [(tokens(gen, 3, vocab), [])]),
    ]  # fmt: skip


def cases(vocab: int) -> dict[str, list[TrajectoryRow]]:
    gen = torch.Generator().manual_seed(0)
    return {
        "single_call": single_call_group(gen, vocab),
        "two_groups": single_call_group(gen, vocab, "g0")
        + single_call_group(gen, vocab, "g1", 31, (2, 9, 4)),
        "multi_call": multi_call_group(gen, vocab),
        "edges": edge_groups(gen, vocab),
    }


class Recorder(torch.optim.Optimizer):
    """Records each step's gradient per parameter and leaves the weights alone."""

    def __init__(self, params):
        super().__init__(list(params), {"lr": 0.0})
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        ps = [p for g in self.param_groups for p in g["params"]]
        self.grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in ps])


def row_logprobs(model, batch: TrainBatch) -> list[torch.Tensor]:
    """Each row's per-token logprobs (shared prefix included), as its layout computes them."""
    with torch.no_grad():
        inputs = forward_inputs(batch.position_ids, batch.row_index, batch.attention_mask)
        lp, _ = token_logprobs(model, batch.input_ids, **inputs)
    par = parents(batch.position_ids)
    out = []
    for i in range(batch.num_rows):
        seq, col = (int(x) for x in torch.nonzero(batch.row_index == i)[0])
        own = torch.nonzero(batch.row_index[seq] == i).squeeze(-1).tolist()
        out.append(lp[seq, root_path(par[seq].tolist(), int(par[seq, col])) + own])
    return out


def update(module: GRPOModule, batch: TrainBatch) -> tuple[float, list[list[torch.Tensor]]]:
    """(train/loss, the gradients of each optimiser step) of one update; the weights stay."""
    opt = Recorder(module.model.parameters())
    m = module.update(batch, opt)
    return m["train/loss"], opt.grads


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def assert_tree_equals_per_row(module: GRPOModule, rows: list[TrajectoryRow], **tree_kw) -> None:
    tree, per_row = collate(rows, mode="tree", **tree_kw), collate(rows, mode="pad")
    assert tree.shared_tokens > 0 and tree.input_ids.numel() < per_row.input_ids.numel()
    for a, b in zip(row_logprobs(module.model, tree), row_logprobs(module.model, per_row), strict=True):
        assert rel(a, b) <= REL
    loss_tree, grads_tree = update(module, tree)
    loss_row, grads_row = update(module, per_row)
    assert abs(loss_tree - loss_row) <= REL * abs(loss_row) and loss_row != 0.0
    assert len(grads_tree) == len(grads_row) >= 1
    for step_tree, step_row in zip(grads_tree, grads_row, strict=True):
        assert sum(float(g.norm()) > 0 for g in step_row) > len(step_row) // 2  # the update trains
        # the whole gradient within REL; each parameter's within 10 x REL (a small gradient, e.g. of
        # one norm weight over 30 layers, carries fp32's reordered sums at ~1e-5 of its size)
        whole = [torch.cat([g.flatten() for g in grads]) for grads in (step_tree, step_row)]
        assert rel(*whole) <= REL
        for g_tree, g_row in zip(step_tree, step_row, strict=True):
            assert rel(g_tree, g_row) <= 10 * REL or float(g_row.norm()) == float(g_tree.norm()) == 0.0


@pytest.fixture(scope="module")
def tiny_module(tiny_model_dir) -> GRPOModule:
    return GRPOModule(tiny_model_dir, settings=GRPOSettings(grad_clip=None, entropy_coef=0.01))


@pytest.mark.parametrize("case", ["single_call", "two_groups", "multi_call", "edges"])
def test_tree_equals_per_row_on_the_tiny_model(tiny_module, case) -> None:
    vocab = tiny_module.model.config.vocab_size
    assert_tree_equals_per_row(tiny_module, cases(vocab)[case])


def test_trees_in_micro_batches_with_kl_and_two_epochs(tiny_model_dir) -> None:
    """The old-logprob and reference passes run the tree too; one tree per micro-batch (a tree is
    never cut), and a group over the token budget split into two trees."""
    module = GRPOModule(
        tiny_model_dir,
        settings=GRPOSettings(grad_clip=None, epochs=2, micro_batch_size=1, kl=losses.kl_k2, kl_coef=0.1),
    )
    with torch.no_grad():  # the policy away from the reference, so KL has a gradient
        for p in module.model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    rows = cases(module.model.config.vocab_size)["two_groups"]
    assert_tree_equals_per_row(module, rows, token_budget=42)
    assert collate(rows, mode="tree", token_budget=42).input_ids.shape[0] == 3


def test_tree_equals_per_row_on_smollm2(smollm2_model_dir) -> None:
    """The real model (30 layers, GQA, 49k vocabulary): all four cases in one batch."""
    module = GRPOModule(smollm2_model_dir, settings=GRPOSettings(grad_clip=None))
    rows = [r for case in cases(module.model.config.vocab_size).values() for r in case]
    assert_tree_equals_per_row(module, rows)


@st.composite
def groups(draw):
    """1-3 groups of 1-4 rollouts over a shared prompt, each a chain of 1-3 calls."""
    out = []
    for g in range(draw(st.integers(1, 3))):
        prompt = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8))
        for k in range(draw(st.integers(1, 4))):
            turns = [
                (draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4)),
                 draw(st.lists(st.integers(0, VOCAB - 1), max_size=3)))
                for _ in range(draw(st.integers(1, 3)))
            ]  # fmt: skip
            samp = [draw(st.sampled_from(SAMPLING)) for _ in turns]
            out.append(
                chain(f"g{g}r{k}", f"g{g}", draw(st.sampled_from([0.0, 1.0])), prompt, turns, sampling=samp)
            )
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=groups())
def test_random_groups_train_as_per_row(rows) -> None:
    """Random groups on the small model: the same loss and gradient (or both skipped)."""
    make = functools.partial(GRPOModule, settings=GRPOSettings(grad_clip=None, filter_zero_variance=False))
    module = make(model=small_model())
    tree, per_row = collate(rows, mode="tree"), collate(rows, mode="pad")
    (loss_tree, g_tree), (loss_row, g_row) = update(module, tree), update(module, per_row)
    # relative, with an fp32 floor: groups whose advantages nearly cancel have a loss and a
    # gradient near 0 (seen: loss 1e-8, gradient norm 3e-10), where a relative error means nothing
    assert abs(loss_tree - loss_row) <= REL * abs(loss_row) + 1e-7
    for a, b in zip(g_tree, g_row, strict=True):
        flat_a, flat_b = torch.cat([g.flatten() for g in a]), torch.cat([g.flatten() for g in b])
        assert float((flat_a - flat_b).norm()) <= REL * float(flat_b.norm()) + 1e-8
