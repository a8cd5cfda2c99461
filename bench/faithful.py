"""Token-faithful prompts at long horizons: gateway CPU per call, incremental vs full render.

A generated tool-use session (system prompt and tools, then per turn a sampled assistant turn
with thinking and a tool call, and a tool result: about 500 tokens appended per turn) is played
through the gateway's `TokenFaithful` with the tiny model's tokenizer. At turns 10, 50 and 100 the
call's prompt is built both ways, side by side in one process:

- incremental: what the gateway does (faithful/incremental.py): the session's chain extended by
  the appended messages, the request body encoded, the call remembered for the next one;
- full: the full path (faithful/prompt.py, what every call did before): a plain render and a
  marked render of the whole conversation, the anchor search, the request body encoded.

CPU time (process_time, the best of --repeat) is the measure: the machine is shared, wall time
is not. The ids of both are compared at every measured turn (they must be identical). The last
line is `turn100/turn10 = X` for the incremental path (target: at most 1.5).

    python bench/faithful.py
    python bench/faithful.py --turns 10,50,100 --repeat 7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

import numpy as np
import orjson

from polar_pl.chat.toolparse import render_tool_call
from polar_pl.gateway.faithful.completion import completion_bytes
from polar_pl.gateway.faithful.history import TokenFaithful
from polar_pl.gateway.faithful.prompt import faithful_prompt
from polar_pl.gateway.store.records import TraceRecord

WORDS = [
    "the",
    "a",
    "file",
    "src",
    "test",
    "def",
    "class",
    "return",
    "import",
    "value",
    "error",
    "path",
    "line",
    "code",
    "function",
    "result",
    "data",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command in the repository and return its output",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


class ToolSession:
    """Turn t: the assistant thinks, says a line and calls bash; the tool answers (~500 tokens)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.text(1500)},
            {"role": "user", "content": self.text(100)},
        ]

    def text(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def assistant(self, t: int) -> dict[str, Any]:
        args = json.dumps({"cmd": self.text(20)})
        fn = {"name": "bash", "arguments": args}
        call = {"id": f"call_{t}", "type": "function", "function": fn}
        return {
            "role": "assistant",
            "content": self.text(40),
            "reasoning": self.text(60),
            "tool_calls": [call],
        }

    def tool(self, t: int) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": f"call_{t}", "content": self.text(330)}


def sampled(tok: Any, msg: dict[str, Any]) -> list[int]:
    """The ids the policy sampled for an assistant turn, as the engine parses it back."""
    fn = msg["tool_calls"][0]["function"]
    text = f"<think>\n{msg['reasoning']}\n</think>\n\n{msg['content']}\n"
    text += render_tool_call(fn["name"], json.loads(fn["arguments"]))
    return tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


def cpu_ms(fn, repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return 1000 * best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", default="10,50,100", help="turns to measure")
    ap.add_argument("--repeat", type=int, default=5, help="best of N (CPU time)")
    ap.add_argument("--model-dir", default=os.environ.get("POLAR_TINY_MODEL", ".cache/tiny-model"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # prompts past the tiny model's context are fine here
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    measure = sorted(int(x) for x in args.turns.split(","))
    gen, faithful = ToolSession(args.seed), TokenFaithful(lambda: tok)
    rows = []
    for t in range(1, max(measure) + 1):
        chat = {"model": "m", "messages": list(gen.messages), "tools": TOOLS, "max_tokens": 512}
        if t in measure:
            rows.append(measure_turn(tok, faithful, chat, t, args.repeat))
        fp = faithful.build("s", chat)
        turn = gen.assistant(t)
        response = sampled(tok, turn)
        faithful.remember(record(t, chat, fp.prompt_ids, response))
        gen.messages += [turn, gen.tool(t)]
    print_table(rows, args.repeat)
    return 0 if all(r["identical"] for r in rows) else 1


def record(t: int, chat: dict[str, Any], prompt: np.ndarray, response: list[int]) -> TraceRecord:
    return TraceRecord(
        session_id="s", call_index=t - 1, timestamp=0.0, provider="openai_chat", raw_request={},
        raw_response="", normalized_request=chat, prompt_ids=prompt, response_ids=response,
        response_logprobs=[-0.5] * len(response), finish_reason="stop", policy_version=0, latency_s=0.0,
    )  # fmt: skip


def measure_turn(
    tok: Any, faithful: TokenFaithful, chat: dict[str, Any], t: int, repeat: int
) -> dict[str, Any]:
    sess = faithful._sessions["s"]
    tips = list(sess.order)

    def incremental():
        for tip in tips:
            tip.turn = None  # each call parses the turn it extends once: no cache across repeats
        fp = faithful.build("s", chat)
        completion_bytes(chat, fp.prompt_ids)
        faithful.remember(record(t + 1000, chat, fp.prompt_ids, [1, 2]))  # what the gateway keeps
        sess.order.pop()
        sess.by_len[len(chat["messages"])].pop()
        return fp

    def full():
        fp = faithful_prompt(tok, chat, tips)
        orjson.dumps({"prompt": fp.prompt_ids.tolist()})  # the body as it was sent: a list of ids
        return fp

    inc_ms, inc = cpu_ms(incremental, repeat)
    full_ms, ref = cpu_ms(full, max(1, repeat // 2))
    assert inc.incremental, faithful.counts
    return {
        "turn": t,
        "prompt_tokens": len(ref.prompt_ids),
        "incremental_ms": inc_ms,
        "full_ms": full_ms,
        "identical": inc.anchor == ref.anchor and np.array_equal(inc.prompt_ids, ref.prompt_ids),
    }


def print_table(rows: list[dict[str, Any]], repeat: int) -> None:
    load = os.getloadavg()
    print(
        f"\ngateway CPU per call (process_time, best of {repeat}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})\n"
    )
    head = "| turn | prompt tokens | incremental ms | full ms | full / incremental | ids identical |"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for r in rows:
        print(
            f"| {r['turn']:>4} | {r['prompt_tokens']:>13} | {r['incremental_ms']:>14.2f} | {r['full_ms']:>7.1f} "
            f"| {r['full_ms'] / r['incremental_ms']:>17.1f}x | {'yes' if r['identical'] else 'NO':>13} |"
        )
    by = {r["turn"]: r for r in rows}
    if 10 in by and 100 in by:
        print(f"\nfull path: turn100/turn10 = {by[100]['full_ms'] / by[10]['full_ms']:.2f}")
        print(f"turn100/turn10 = {by[100]['incremental_ms'] / by[10]['incremental_ms']:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
