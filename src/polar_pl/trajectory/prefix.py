"""`prefix` builder: merge calls into chains when each call's prompt extends the chain's tokens.

Rule. A call extends a chain when the chain's tokens so far (its last call's prompt followed by that
call's sampled response, exactly as the engine returned them) are a token prefix of the call's
prompt. Whatever the prompt adds after them is masked with logprob 0: tool results, the next user
turn, and the chat template's end-of-turn glue.

End-of-turn glue (ChatML / Qwen3). A response that stopped normally ends with the sampled
`<|im_end|>` (vLLM includes the EOS in the token ids), and the next prompt re-renders the turn as
`... <|im_end|>\\n<|im_start|>user ...`, so the chain is a plain prefix and the `\\n` is masked glue.
A response cut by length (or returned without its stop token) has no `<|im_end|>`; the re-rendered
prompt then continues the sampled tokens with an `<|im_end|>` the policy never sampled. The rule
needs no special case: the chain is still a prefix, and that `<|im_end|>` is glue, masked (we do
not teach the policy to stop where it did not). If the re-render changes the sampled tokens
themselves (re-tokenized text, stripped thinking), the call does not extend the chain: a DRIFT
break, which token-faithful prompts remove.

Chains. A session may hold several chains at once (a subagent interleaved with its parent): a call
joins the longest chain it extends, otherwise starts a new one and the break is classified against
the chain sharing the longest token prefix with it (see `breaks.py`). Side calls never join or
start a task chain; each is its own row, counted as a SIDE_CALL break.

Cost. Prompts are int32 arrays and the prefix test is `bytes.startswith` (memcmp). Records read
packed from the store (store/layout.py) are arrays over the blobs already: nothing is converted,
and the rows are built with numpy (lists again only for records that held lists).
"""

from __future__ import annotations

from collections.abc import Sequence

from polar_pl.gateway.store.records import TraceRecord
from polar_pl.trajectory.base import (
    FIRST,
    BreakKind,
    BuildResult,
    Call,
    MergeStats,
    SideCallOptions,
    make_row,
    prepare,
    spliced,
)
from polar_pl.trajectory.breaks import chain_lcp, classify_break
from polar_pl.trajectory.rows import TrajectoryRow


class _Chain:
    """Mutable per-build state of one chain (never outlives `build`)."""

    __slots__ = ("calls", "start", "tokens")

    def __init__(self, call: Call, start: str) -> None:
        self.calls = [call]
        self.start = start
        self.tokens = call.num_tokens

    def extended_by(self, call: Call) -> bool:
        last = self.calls[-1]
        end = self.tokens
        if len(call.prompt) < end or (
            end and call.prompt[end - 1] != (last.response if len(last.response) else last.prompt)[-1]
        ):
            return False  # O(1) rejects before any bytes are compared
        # memcmp: the response (short, most distinctive) first; then the long prompt part.
        p = call.prompt_bytes
        return p.startswith(last.response_bytes, len(last.prompt_bytes)) and p.startswith(last.prompt_bytes)

    def append(self, call: Call) -> None:
        self.calls.append(call)
        self.tokens = call.num_tokens


class PrefixBuilder(SideCallOptions):
    """Merge a session's calls into as few rows as exact token prefixes allow.

    include_side_calls: emit one row per side call (never merged into task chains).
    side_calls_inherit_reward: give side rows the rollout's reward; otherwise they get side_reward.
    """

    name = "prefix"

    def build(
        self,
        records: Sequence[TraceRecord],
        *,
        reward: float = 0.0,
        status: str = "ok",
        harness: str | None = None,
    ) -> BuildResult:
        calls = prepare(records)
        chains: list[_Chain] = []  # main chains and side rows, in creation order
        main: list[_Chain] = []
        failed: list[Call] = []  # failed calls with nothing sampled, for break classification
        breaks: dict[str, int] = {}
        skipped = call_tokens = 0
        for c in calls:
            if c.skipped:
                failed.append(c)
                skipped += 1
                continue
            if c.rec.call_kind == "side":
                if not self.include_side_calls:
                    skipped += 1
                    continue
                chains.append(_Chain(c, BreakKind.SIDE_CALL.value))
                breaks[BreakKind.SIDE_CALL.value] = breaks.get(BreakKind.SIDE_CALL.value, 0) + 1
                call_tokens += c.num_tokens
                continue
            call_tokens += c.num_tokens
            # longest first (the most recent on ties): the first chain extended is the one to join
            if len(main) == 1:  # most sessions: no subagent, nothing to sort (per call)
                best = main[0] if main[0].extended_by(c) else None
            else:
                by_length = sorted(enumerate(main), key=lambda ic: (ic[1].tokens, ic[0]), reverse=True)
                best = next((ch for _, ch in by_length if ch.extended_by(c)), None)
            if best is not None:
                best.append(c)
                continue
            start = FIRST if not main else self._classify(c, main, failed).value
            if start != FIRST:
                breaks[start] = breaks.get(start, 0) + 1
            ch = _Chain(c, start)
            main.append(ch)
            chains.append(ch)
        rows = [self._row(ch, reward, status, harness, i) for i, ch in enumerate(chains)]
        stats = MergeStats(
            sessions=1 if calls else 0,
            calls=len(calls),
            skipped_calls=skipped,
            rows=len(rows),
            call_tokens=call_tokens,
            row_tokens=sum(len(r.input_ids) for r in rows),
            sampled_tokens=sum(r.num_trainable for r in rows),
            spliced_calls=sum(spliced(c) for c in calls),
            breaks=breaks,
        )
        return BuildResult(rows, stats)

    @staticmethod
    def _classify(call: Call, main: list[_Chain], failed: list[Call]) -> BreakKind:
        nearest = max(reversed(main), key=lambda ch: chain_lcp(call, ch.calls[-1]))
        since = nearest.calls[-1].pos
        between = [f for f in failed if since < f.pos < call.pos]
        return classify_break(call, nearest.calls, between)

    def _row(self, ch: _Chain, reward: float, status: str, harness: str | None, i: int) -> TrajectoryRow:
        side = ch.start == BreakKind.SIDE_CALL
        r = self.side_reward if side and not self.side_calls_inherit_reward else reward
        return make_row(
            ch.calls, reward=r, status=status, harness=harness, meta={"start": ch.start, "chain": i}
        )
