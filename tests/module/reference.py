"""An independent per-row reference of one GRPO update, written with plain loops over rows and
tokens (each row through the model on its own, no packing, no vectorised bookkeeping) and
sharing no code with polar_pl.module. Property tests compare GRPOModule.update against it."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

import torch

from polar_pl.trajectory.rows import TrajectoryRow


@dataclass(frozen=True)
class RefConfig:
    advantage: str = "group_mean"  # group_mean | group_mean_nostd | leave_one_out
    aggregation: str = "token_mean"  # token_mean | seq_mean_token_mean | rollout_mean | sum_norm
    max_len: int = 16
    side_rows: str = "own"
    filter_zero_variance: bool = True
    tis_cap: float | None = None
    kl_coef: float = 0.0  # k2 against the reference model
    entropy_coef: float = 0.0
    eps_low: float = 0.2
    eps_high: float = 0.28


def processed_logprobs(
    z: torch.Tensor, temperature: float, top_k: int, top_p: float, target: int
) -> torch.Tensor:
    """(V,) log-probabilities of the sampling distribution at one position: temperature, top-k
    (ties with the k-th value kept), then the smallest nucleus reaching top_p; the sampled
    `target` always kept."""
    if temperature < 1e-5:
        return torch.log_softmax(z, -1)
    z = z / temperature
    vocab = z.numel()
    keep = torch.ones(vocab, dtype=torch.bool)
    if 0 < top_k < vocab:
        kth = torch.sort(z.detach(), descending=True).values[top_k - 1]
        keep = z.detach() >= kth
    if top_p < 1.0:
        probs = torch.softmax(z.detach().masked_fill(~keep, -torch.inf), -1)
        nucleus = torch.zeros(vocab, dtype=torch.bool)
        mass = 0.0
        for j in torch.argsort(probs, descending=True).tolist():
            if mass >= top_p or probs[j] == 0:
                break
            nucleus[j] = True
            mass += float(probs[j])
        keep = keep & nucleus
    keep[target] = True
    return torch.log_softmax(z.masked_fill(~keep, -torch.inf), -1)


def _unit(row: TrajectoryRow) -> tuple[str, str] | None:
    side = row.meta.get("call_kind") == "side"
    return (row.rollout_id + "/side", row.group_id + "/side") if side else (row.rollout_id, row.group_id)


def advantages(rows: list[TrajectoryRow], cfg: RefConfig) -> tuple[dict[str, float], set[str]]:
    """(advantage per unit, units kept after the zero-variance filter)."""
    reward, group_of = {}, {}
    for r in rows:
        if cfg.side_rows == "exclude" and r.meta.get("call_kind") == "side":
            continue
        unit, group = _unit(r)
        reward[unit], group_of[unit] = r.reward, group
    members = defaultdict(list)
    for unit, group in group_of.items():
        members[group].append(unit)
    adv, kept = {}, set()
    for units in members.values():
        rs = [reward[u] for u in units]
        mean = sum(rs) / len(rs)
        std = statistics.stdev(rs) if len(rs) > 1 else 0.0
        for u in units:
            if len(rs) == 1:
                a = 0.0
            elif cfg.advantage == "leave_one_out":
                a = reward[u] - (sum(rs) - reward[u]) / (len(rs) - 1)
            else:
                a = reward[u] - mean
                if cfg.advantage == "group_mean":
                    a = a / (std + 1e-6)
            adv[u] = a
        if not cfg.filter_zero_variance or (len(rs) > 1 and max(rs) - min(rs) > 1e-8):
            kept.update(units)
    return adv, kept


def token_weights(
    rows: list[TrajectoryRow], tokens: dict[int, list[int]], cfg: RefConfig
) -> dict[int, float]:
    """Per row, the weight of each of its trainable tokens (`tokens`: row -> trainable positions)."""
    unit_rows = defaultdict(list)
    for i, ts in tokens.items():
        if ts:
            unit_rows[_unit(rows[i])[0]].append(i)
    k = len(unit_rows)
    total = sum(len(ts) for ts in tokens.values())
    out = {}
    for members in unit_rows.values():
        unit_tokens = sum(len(tokens[i]) for i in members)
        for i in members:
            c = len(tokens[i])
            out[i] = {
                "token_mean": 1.0 / total,
                "seq_mean_token_mean": 1.0 / (c * len(members) * k),
                "rollout_mean": 1.0 / (unit_tokens * k),
                "sum_norm": 1.0 / (cfg.max_len * k),
            }[cfg.aggregation]
    return out


def _row_terms(model, ref_model, row: TrajectoryRow, ts: list[int], samp: list[dict]):
    """(logp, entropy, ref logp) at positions ts of one row, run through the model alone."""
    ids = torch.tensor([row.input_ids])
    pos = torch.arange(len(row.input_ids))[None]
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()
    ref_logits = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logits = ref_model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()
    out = []
    for t in ts:
        s = samp[t]
        lp_all = processed_logprobs(logits[t - 1], s["temperature"], s["top_k"], s["top_p"], row.input_ids[t])
        p = lp_all.exp()
        ent = -(p * torch.where(torch.isfinite(lp_all), lp_all, 0.0)).sum()
        ref = None
        if ref_logits is not None:
            ref = processed_logprobs(
                ref_logits[t - 1], s["temperature"], s["top_k"], s["top_p"], row.input_ids[t]
            )
            ref = ref[row.input_ids[t]]
        out.append((lp_all[row.input_ids[t]], ent, ref))
    return out


def per_token_sampling(row: TrajectoryRow) -> list[dict]:
    """Sampling settings of each position of a row, from its recorded calls."""
    default = {"temperature": 1.0, "top_k": -1, "top_p": 1.0}
    out = [default] * len(row.input_ids)
    calls = row.meta.get("calls") or []
    for j, c in enumerate(calls):
        end = calls[j + 1]["start"] if j + 1 < len(calls) else len(row.input_ids)
        for t in range(c["start"], end):
            if row.loss_mask[t]:
                out[t] = default | (c.get("sampling") or {})
    return out


def loss(model, ref_model, rows: list[TrajectoryRow], old: dict, cfg: RefConfig) -> torch.Tensor:
    """The scalar GRPO loss of `rows` at the model's current weights; `old` maps (row, t) to the
    logprob before the update (filled on the first call)."""
    adv, kept = advantages(rows, cfg)
    tokens = {}
    for i, r in enumerate(rows):
        excluded = cfg.side_rows == "exclude" and r.meta.get("call_kind") == "side"
        ok = not excluded and _unit(r)[0] in kept
        tokens[i] = [t for t in range(1, len(r.input_ids)) if r.loss_mask[t] and ok]
    weights = token_weights(rows, tokens, cfg)
    total = torch.zeros(())
    for i, ts in tokens.items():
        if not ts:
            continue
        r, a = rows[i], adv[_unit(rows[i])[0]]
        for t, (lp, ent, ref) in zip(
            ts, _row_terms(model, ref_model, r, ts, per_token_sampling(r)), strict=True
        ):
            o = old.setdefault((i, t), float(lp.detach()))
            ratio = torch.exp(lp - o)
            term = torch.maximum(-a * ratio, -a * ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high))
            if cfg.tis_cap is not None:
                term = term * min(math.exp(o - r.behavior_logprobs[t]), cfg.tis_cap)
            if cfg.kl_coef:
                term = term + cfg.kl_coef * 0.5 * (lp - ref) ** 2
            term = term - cfg.entropy_coef * ent
            total = total + weights[i] * term
    return total
