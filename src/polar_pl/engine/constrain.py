"""Forced tool calls (`tool_choice: "required"` or a named function) by a token mask, as vLLM 0.32
does them for the hermes parser.

vLLM (`tool_parsers/structural_tag_registry.py`, hermes) constrains the output with an xgrammar
structural tag: one (named) or one or more (required) tags back to back, each
`<tool_call>\\n{"name": "NAME", "arguments": ` + JSON + `}\\n</tool_call>` (or the same without the
two newlines), then end of sequence; with a reasoning parser the constraint starts after
`</think>`. Tools without `strict: true` get free JSON arguments (any JSON value); the answer is then
parsed by the hermes parser as usual.

Here the same language is a small character automaton (`ToolCallGrammar`, `step`) and the mask is
computed per decode step over the token texts: exact for this language and cheap for a vocabulary
of a few thousand tokens (a full Qwen vocabulary makes a constrained step cost ~1 s on CPU).
Differences to vLLM: `strict: true` argument schemas are not enforced (arguments are any JSON value),
and JSON whitespace is allowed only inside objects and arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_WS = " \t\n\r"
_ESC = '"\\/bfnrtu'
_HEX = "0123456789abcdefABCDEF"


@dataclass(frozen=True, slots=True)
class ToolCallGrammar:
    """tags: (begin, end) pairs; stop_after_first: a named tool_choice (exactly one call);
    after_think: free text until `</think>` first (a reasoning parser is on)."""

    tags: tuple[tuple[str, str], ...]
    stop_after_first: bool
    after_think: bool = False

    @classmethod
    def for_tools(
        cls, names: list[str], stop_after_first: bool, after_think: bool = False
    ) -> ToolCallGrammar:
        tags = []
        for name in names:
            tags.append((f'<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>"))
            tags.append((f'<tool_call>{{"name": "{name}", "arguments": ', "}</tool_call>"))
        return cls(tuple(tags), stop_after_first, after_think)

    def initial(self) -> tuple:
        return ("think", "") if self.after_think else ("begin", "")


# States (immutable tuples):
#   ("think", tail)                 free text until </think>
#   ("begin", prefix)               prefix of some tag's begin string
#   ("json", end, stack, mode, aux) inside the arguments value; stack of "{" / "[" containers
#   ("end", end, matched)           matching the tag's end string
#   ("after",)                      between tags / done (accepting)
THINK_END = "</think>"


def _json(end: str, stack: tuple, mode: str, aux=None) -> tuple:
    return ("json", end, stack, mode, aux)


def _value_done(end: str, stack: tuple) -> tuple:
    return _json(end, stack, "after_value") if stack else ("end", end, "")


def _start_value(end: str, stack: tuple, ch: str):
    if ch == "{":
        return _json(end, (*stack, "{"), "key_or_close")
    if ch == "[":
        return _json(end, (*stack, "["), "value_or_close")
    if ch == '"':
        return _json(end, stack, "string", 0)
    if ch == "-":
        return _json(end, stack, "number", "sign")
    if ch == "0":
        return _json(end, stack, "number", "zero")
    if ch.isdigit() and ch.isascii():
        return _json(end, stack, "number", "int")
    for lit in ("true", "false", "null"):
        if ch == lit[0]:
            return _json(end, stack, "literal", lit[1:])
    return None


_NUM = {  # substate -> {char class: next substate}; complete substates end the number
    "sign": {"0": "zero", "d": "int"},
    "zero": {".": "dot", "e": "e"},
    "int": {"d": "int", "0": "int", ".": "dot", "e": "e"},
    "dot": {"d": "frac", "0": "frac"},
    "frac": {"d": "frac", "0": "frac", "e": "e"},
    "e": {"d": "exp", "0": "exp", "+": "esign", "-": "esign"},
    "esign": {"d": "exp", "0": "exp"},
    "exp": {"d": "exp", "0": "exp"},
}
_NUM_DONE = {"zero", "int", "frac", "exp"}


def _num_class(ch: str) -> str:
    if ch == "0":
        return "0"
    if ch in "123456789":
        return "d"
    if ch in "eE":
        return "e"
    return ch


def _json_step(state: tuple, ch: str):
    _, end, stack, mode, aux = state
    if mode == "string" or mode == "key":
        if aux == 0:
            if ch == '"':
                return _json(end, stack, "colon") if mode == "key" else _value_done(end, stack)
            if ch == "\\":
                return _json(end, stack, mode, 1)
            return None if ord(ch) < 0x20 else state
        if aux == 1:
            if ch not in _ESC:
                return None
            return _json(end, stack, mode, 2 if ch == "u" else 0)
        if ch not in _HEX:  # aux 2..5: \\u hex digits
            return None
        return _json(end, stack, mode, 0 if aux == 5 else aux + 1)
    if mode == "number":
        nxt = _NUM[aux].get(_num_class(ch))
        if nxt is not None:
            return _json(end, stack, "number", nxt)
        if aux not in _NUM_DONE:
            return None
        return _step(_value_done(end, stack), ch)
    if mode == "literal":
        if not aux or ch != aux[0]:
            return None
        return _json(end, stack, "literal", aux[1:]) if len(aux) > 1 else _value_done(end, stack)
    if ch in _WS and stack:
        return state
    if mode == "value":
        return _start_value(end, stack, ch)
    if mode == "value_or_close":
        if ch == "]":
            return _value_done(end, stack[:-1])
        return _start_value(end, stack, ch)
    if mode == "key_or_close" or mode == "key_start":
        if ch == '"':
            return _json(end, stack, "key", 0)
        if ch == "}" and mode == "key_or_close":
            return _value_done(end, stack[:-1])
        return None
    if mode == "colon":
        return _json(end, stack, "value") if ch == ":" else None
    if mode == "after_value":
        top = stack[-1]
        if ch == ",":
            return _json(end, stack, "key_start" if top == "{" else "value")
        if (ch == "}" and top == "{") or (ch == "]" and top == "["):
            return _value_done(end, stack[:-1])
        return None
    return None


def _step(state: tuple, ch: str, grammar: ToolCallGrammar | None = None):
    kind = state[0]
    if kind == "json":
        return _json_step(state, ch)
    if kind == "end":
        _, end, matched = state
        m = matched + ch
        if not end.startswith(m):
            return None
        return ("after",) if m == end else ("end", end, m)
    raise AssertionError(kind)


def advance(grammar: ToolCallGrammar, state: tuple | None, text: str) -> tuple | None:
    """The state after `text`, or None if the text leaves the language."""
    for ch in text:
        if state is None:
            return None
        kind = state[0]
        if kind == "think":
            tail = (state[1] + ch)[-len(THINK_END) :]
            state = ("begin", "") if tail == THINK_END else ("think", tail)
        elif kind == "after":
            if grammar.stop_after_first:
                return None
            state = ("begin", "")
            state = advance(grammar, state, ch)
        elif kind == "begin":
            prefix = state[1] + ch
            match = [(b, e) for b, e in grammar.tags if b.startswith(prefix)]
            if not match:
                return None
            exact = [e for b, e in match if b == prefix]
            state = _json(exact[0], (), "value") if exact else ("begin", prefix)
        else:
            state = _step(state, ch)
    return state


def accepting(state: tuple | None) -> bool:
    return state is not None and state[0] in ("after", "think")


@dataclass(slots=True)
class ConstraintState:
    """One sequence's position in the grammar; `mask` gives the tokens allowed next."""

    grammar: ToolCallGrammar
    state: tuple | None

    def mask(self, token_texts: list[str], stop_ids: set[int], vocab: int) -> torch.Tensor:
        """(V,) bool: tokens that keep the output in the language (stop tokens only where it may end)."""
        allowed = torch.zeros(vocab, dtype=torch.bool)
        ok = [
            i
            for i, t in enumerate(token_texts)
            if t and i not in stop_ids and advance(self.grammar, self.state, t)
        ]
        if ok:
            allowed[ok] = True
        if accepting(self.state):
            allowed[[i for i in stop_ids if i < vocab]] = True
        return allowed

    def update(self, text: str) -> None:
        self.state = advance(self.grammar, self.state, text)
