"""The sampling settings each engine call states, so the record says what the engine sampled from.

The engine reports logprobs of the distribution it sampled from (vLLM's `processed_logprobs`):
after temperature, top-k and top-p. The trainer rebuilds that distribution from the settings in
the record, so every call states them explicitly (an engine filling in a missing one from the
model's generation_config, as vLLM does, would sample from a distribution the record does not
show), and settings the trainer cannot reproduce (penalties that depend on the tokens so far,
min_p, logit_bias) are dropped, with a note.

Policies (gateway option `sampling`):
- "recorded" (default): the harness's temperature / top_p / top_k, defaults 1 / 1 / off;
- "pinned": temperature 1 (or the gateway's `pinned_temperature`), top_p 1, no top_k whatever
  the harness asked: the run, not each CLI, chooses what the policy samples from (at temperature
  1, raw = processed logprobs: the same numbers under any engine logprobs mode).
"""

from __future__ import annotations

from typing import Any

POLICIES = ("recorded", "pinned")
DEFAULTS: dict[str, float | int] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
# Settings the trainer cannot reproduce, with the value at which they do nothing.
UNREPRODUCED: dict[str, Any] = {
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": {},
}


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"sampling={policy!r}: allowed {', '.join(POLICIES)}")
    return policy


def settle_sampling(chat: dict[str, Any], policy: str, notes: list[str], temperature: float = 1.0) -> None:
    """Rewrite the engine request `chat` in place (see the module docstring); what changed is
    appended to `notes`. temperature: the pinned policy's."""
    pinned = {**DEFAULTS, "temperature": temperature}
    for key, neutral in UNREPRODUCED.items():
        value = chat.pop(key, None)
        if value is not None and value != neutral:
            notes.append(f"dropped {key}={value!r}: the trainer reproduces temperature, top_p, top_k only")
    for key, default in DEFAULTS.items():
        asked = chat.get(key)
        if key == "top_k" and asked == 0:
            asked = None  # 0 and -1 both mean off
        if policy == "pinned":
            if asked is not None and asked != pinned[key]:
                notes.append(f"sampling pinned: {key} {asked!r} -> {pinned[key]!r}")
            chat[key] = pinned[key]
        else:
            chat[key] = default if asked is None else asked
