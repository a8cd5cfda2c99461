"""Every numeric sampling field of every provider API, checked in one place before anything uses it.

The gateway does arithmetic on some of these (the max_tokens cap takes a `min()`), the sampling
policy compares them and the engine receives them: a string, list, object or bool there was a 500
with a traceback, or an engine error that said nothing about the harness's field (issue 32). So
`normalize` (providers/__init__.py) runs `check_numbers` on the raw request before the adapter
converts it, and the adapters copy these fields without checking them again.

Each API's table names its fields as the API spells them (Google's also match the snake_case
spelling its API accepts, google/names.py), whether each must be an integer (a bool is neither)
and its range, from the API's documentation. The first bad field raises `RequestError`, which the
core answers with 400 in the provider's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from polar_pl.gateway.providers.base import RequestError
from polar_pl.gateway.providers.google.names import camel


@dataclass(frozen=True, slots=True)
class NumberField:
    """A numeric field at `path` (keys from the request's top level), with its bounds (inclusive)."""

    path: tuple[str, ...]
    integer: bool = False
    low: float | None = None
    high: float | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value`, or None when it fits."""
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be {kind}, got {_describe(value)}"
        if self.integer and not isinstance(value, int):
            return f"must be {kind}, got {value!r}"
        if self.low is not None and self.high is not None and not self.low <= value <= self.high:
            return f"must be between {_num(self.low)} and {_num(self.high)}, got {value!r}"
        if self.low is not None and value < self.low:
            return f"must be at least {_num(self.low)}, got {value!r}"
        return None


def _num(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)


def _describe(value: Any) -> str:
    names = {str: "a string", list: "an array", dict: "an object", bool: "a boolean"}
    text = repr(value)
    shown = text if len(text) <= 40 else f"{text[:37]}..."
    return f"{names.get(type(value), type(value).__name__)} ({shown})"


def _fields(*specs: tuple[str | tuple[str, ...], dict[str, Any]]) -> tuple[NumberField, ...]:
    return tuple(NumberField((p,) if isinstance(p, str) else p, **b) for p, b in specs)


POSITIVE_INT = {"integer": True, "low": 1}
UNIT = {"low": 0, "high": 1}
TEMPERATURE_2 = {"low": 0, "high": 2}
PENALTY = {"low": -2, "high": 2}
ANY_INT = {"integer": True}

FIELDS: dict[str, tuple[NumberField, ...]] = {
    "anthropic": _fields(
        ("max_tokens", POSITIVE_INT),
        ("temperature", UNIT),
        ("top_p", UNIT),
        ("top_k", {"integer": True, "low": 0}),
        (("thinking", "budget_tokens"), {"integer": True, "low": 0}),
    ),
    "openai_chat": _fields(
        ("max_tokens", POSITIVE_INT),
        ("max_completion_tokens", POSITIVE_INT),
        ("temperature", TEMPERATURE_2),
        ("top_p", UNIT),
        ("n", POSITIVE_INT),
        ("seed", ANY_INT),
        ("presence_penalty", PENALTY),
        ("frequency_penalty", PENALTY),
        ("top_logprobs", {"integer": True, "low": 0, "high": 20}),
        # vLLM's extensions, which the engine takes as they are
        ("top_k", {"integer": True, "low": -1}),
        ("min_p", UNIT),
        ("repetition_penalty", {"low": 0}),
    ),
    "openai_responses": _fields(
        ("max_output_tokens", POSITIVE_INT),
        ("temperature", TEMPERATURE_2),
        ("top_p", UNIT),
        ("top_logprobs", {"integer": True, "low": 0, "high": 20}),
    ),
    "google": _fields(
        (("generationConfig", "maxOutputTokens"), POSITIVE_INT),
        (("generationConfig", "temperature"), TEMPERATURE_2),
        (("generationConfig", "topP"), UNIT),
        (("generationConfig", "topK"), {"integer": True, "low": 0}),
        (("generationConfig", "seed"), ANY_INT),
        (("generationConfig", "candidateCount"), POSITIVE_INT),
        (("generationConfig", "presencePenalty"), PENALTY),
        (("generationConfig", "frequencyPenalty"), PENALTY),
        (("generationConfig", "logprobs"), {"integer": True, "low": 0, "high": 20}),
        # -1: the model decides; 0: no thinking
        (("generationConfig", "thinkingConfig", "thinkingBudget"), {"integer": True, "low": -1}),
    ),
}


# How an API's keys are matched to the table's spelling (Google: either spelling, as it accepts).
SPELLING: dict[str, Callable[[str], str]] = {"google": camel}


def _found(node: Any, path: tuple[str, ...], spell: Callable[[str], str] | None, at: str = "") -> Iterator:
    """(name as sent, value) of each value at `path`, under any spelling `spell` maps to it; a
    level that is not an object has none (the adapter reports a malformed object)."""
    if not path:
        yield at, node
        return
    if not isinstance(node, dict):
        return
    keys = [k for k in node if spell(k) == path[0]] if spell else [path[0]] if path[0] in node else []
    for key in keys:
        yield from _found(node[key], path[1:], spell, f"{at}.{key}" if at else key)


def check_numbers(api: str, body: dict[str, Any]) -> None:
    """Raise RequestError naming the first numeric sampling field of `api` that is malformed
    (absent and null fields are the adapter's default)."""
    spell = SPELLING.get(api)
    for field in FIELDS.get(api, ()):
        for name, value in _found(body, field.path, spell):
            if value is not None and (problem := field.problem(value)) is not None:
                raise RequestError(f"{name}: {problem}")
