"""A harness run's outcome is not its answer: how a run that failed is labelled and trained.

A CLI that exits non-zero, or that got an error from the model API, prints an error message where
its answer would be ("API Error: response exceeded the output token maximum"). Scoring that text
trains the model on the harness's error wording, so such a run gets status `harness_error` with
the reason and is never evaluated. Whether it trains depends on the cause:

- policy: the model caused it, so its tokens train with reward 0 — its last main call was cut by
  the response cap (finish `length`: the harness rejects an unfinished answer), the gateway
  noted a malformed tool call in it, or the harness says so by its exit code (the mini agent's
  3: out of turns; a spec lists these as `policy_exit_codes`);
- infra: anything else — an engine or gateway error, no model call at all (the CLI failed to
  start or to authenticate), or an exit the records do not explain — is masked: nothing the
  policy did is known to have caused it, so it must not be pushed down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polar_pl.gateway.store.records import TraceRecord

POLICY, INFRA = "policy", "infra"


@dataclass(frozen=True, slots=True)
class HarnessOutcome:
    """cause: None for a clean run, else POLICY or INFRA; reason: what happened, for the logs."""

    cause: str | None
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.cause is not None


def classify(
    exit_code: int,
    stderr: str,
    stdout: str,
    records: Sequence[TraceRecord],
    policy_exit_codes: Mapping[int, str] | None = None,
) -> HarnessOutcome:
    """The outcome of a run that did not time out, from its exit status and its calls' records."""
    main = [r for r in records if r.call_kind == "main"]
    errors = [r for r in records if r.status == "error"]
    if errors:
        return HarnessOutcome(INFRA, f"model API error: {(errors[-1].error or '')[:200]}")
    if exit_code == 0:
        return HarnessOutcome(None)
    said = _last_line(stderr) or _last_line(stdout)
    reason = f"exit {exit_code}: {said}"[:300]
    if not main:
        return HarnessOutcome(INFRA, f"{reason} (no model call recorded)")
    if policy_exit_codes and exit_code in policy_exit_codes:
        return HarnessOutcome(POLICY, f"{reason} ({policy_exit_codes[exit_code]})")
    last = main[-1]
    if last.finish_reason == "length":
        return HarnessOutcome(POLICY, f"{reason} (last response cut by the response cap)")
    if any(n.startswith("malformed tool call") for n in last.notes):
        return HarnessOutcome(POLICY, f"{reason} (malformed tool call)")
    return HarnessOutcome(INFRA, reason)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""
