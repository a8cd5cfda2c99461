"""Hypothesis strategy: sessions of trace records shaped like real harness traffic.

A session is driven by a list of operations on a set of live conversations: open a new one
(a task or a subagent), extend one (tool result or user turn, optionally after a truncated
response), compact one (keep a prefix, rewrite the rest), re-render one with drift, a side call, a
failed or aborted call. Token values come from a small alphabet so accidental prefix matches happen.
"""

from __future__ import annotations

from hypothesis import strategies as st
from traj_tokens import GEN, E, rec, system, tool_result, user

from polar_pl.gateway.store.records import TraceRecord

_tok = st.integers(min_value=100, max_value=104)
_text = st.lists(_tok, min_size=0, max_size=4)
_resp = st.lists(_tok, min_size=1, max_size=5)

OPS = st.one_of(
    st.tuples(st.just("new"), _text, _text, _resp),
    st.tuples(st.just("extend"), st.integers(0, 3), _text, _resp, st.booleans()),
    st.tuples(st.just("compact"), st.integers(0, 3), st.integers(0, 40), _text, _resp),
    st.tuples(st.just("drift"), st.integers(0, 3), st.integers(0, 40), _text, _resp),
    st.tuples(st.just("side"), _text, _resp),
    st.tuples(st.just("fail"), st.integers(0, 3), _text),
    st.tuples(st.just("abort"), st.integers(0, 3), _text, _resp),
)


def simulate(ops: list[tuple], *, versions: list[int] | None = None) -> list[TraceRecord]:
    """Play `ops` into records: conversation state is the token context a harness would resend."""
    convs: list[list[int]] = []  # context of each conversation (prompt + last response)
    records: list[TraceRecord] = []

    def emit(prompt: list[int], response: list[int], **kw) -> None:
        i = len(records)
        lps = [-(i * 100 + k + 1) / 7 for k in range(len(response))]  # unique per sampled token
        v = (versions or [0])[i % len(versions or [0])]
        records.append(
            rec(i, prompt, response, logprobs=lps, versions=[v + k % 2 for k in range(len(response))], **kw)
        )

    for op in ops:
        kind = op[0]
        if kind == "new" or not convs and kind != "side":
            sys_t, user_t, resp = (op[1], op[2], op[3]) if kind == "new" else ([], [], [100])
            prompt = system(*sys_t) + user(*user_t) + GEN
            emit(prompt, resp + [E])
            convs.append(prompt + resp + [E])
            continue
        if kind == "side":
            emit(system(*op[1]) + GEN, op[2] + [E], kind="side")
            continue
        c = op[1] % len(convs)
        ctx = convs[c]
        if kind == "extend":
            _, _, text, resp, cut = op
            prompt = ctx + [3] + tool_result(*text) + GEN
            response = resp if cut else resp + [E]
            emit(prompt, response, finish="length" if cut else "stop")
            # a cut response is re-rendered with the <|im_end|> the policy never sampled
            convs[c] = prompt + response + ([E] if cut else [])
        elif kind == "compact":
            _, _, cut, text, resp = op
            prompt = ctx[: min(cut, len(ctx))] + user(*text) + GEN
            emit(prompt, resp + [E])
            convs[c] = prompt + resp + [E]
        elif kind == "drift":
            _, _, at, text, resp = op
            changed = list(ctx)
            changed[at % len(changed)] = 105  # a token the generator never samples
            prompt = changed + [3] + user(*text) + GEN
            emit(prompt, resp + [E])
            convs[c] = prompt + resp + [E]
        elif kind == "fail":
            emit(ctx + [3] + user(*op[2]) + GEN, [], status="error", error="engine 503", finish=None)
        elif kind == "abort":
            emit(ctx + [3] + user(*op[2]) + GEN, op[3], status="aborted", finish=None)
    return records


sessions = st.lists(OPS, min_size=1, max_size=12).map(simulate)
clean_sessions = st.lists(
    st.tuples(st.just("extend"), st.just(0), _text, _resp, st.booleans()), min_size=0, max_size=10
).map(lambda ops: simulate([("new", [100], [101], [102]), *ops]))
