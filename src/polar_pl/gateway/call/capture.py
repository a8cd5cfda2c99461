"""What one engine call produced, collected chunk by chunk from the engine's stream.

Token ids come from the engine (`prompt_token_ids` on the first chunk, `token_ids` per choice
chunk, vLLM's `return_token_ids`), logprobs from `logprobs.content`, and the policy version from
the `x-policy-version` header or a `policy_version` field on chunks (a weight update can land
mid-generation, so it is tracked per token). An engine that tags no version (vLLM) but answered
from a LoRA adapter `<served>-lora-v<N>` (utils/adapters.py) names it in the answer's `model`:
its tokens are recorded with version N. The same object assembles the full
`chat.completion` for harnesses that did not ask for a stream.
"""

from __future__ import annotations

import time
from typing import Any

from polar_pl.utils.adapters import adapter_version


class CallCapture:
    __slots__ = (
        "_saw_version",
        "chunks",
        "content",
        "created",
        "finish_reason",
        "first_token_at",
        "id",
        "logprobs",
        "model",
        "policy_version",
        "prompt_ids",
        "reasoning",
        "response_ids",
        "stop_reason",
        "token_versions",
        "tool_calls",
        "usage",
    )

    def __init__(self, policy_version: int | None = None):
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.logprobs: list[float] = []
        self.token_versions: list[int] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        # vLLM's matched stop string (or stop token id): Anthropic reports it as stop_sequence
        self.stop_reason: str | int | None = None
        self.usage: dict[str, Any] = {}
        self.policy_version = policy_version if policy_version is not None else 0
        self.id = ""
        self.created = 0
        self.model = ""
        self.chunks = 0
        self.first_token_at: float | None = None  # time.monotonic() when the first token came
        self._saw_version = False

    def add(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        if self.chunks == 1:
            self.id = chunk.get("id") or ""
            self.created = chunk.get("created") or 0
            self.model = chunk.get("model") or ""
            served = adapter_version(self.model)
            if served is not None and chunk.get("policy_version") is None:
                self.policy_version = served  # the adapter that answered is the version
        pids = chunk.get("prompt_token_ids")
        if pids:
            self.prompt_ids = pids
        pv = chunk.get("policy_version")
        if pv is not None:
            self.policy_version = int(pv)
            self._saw_version = True
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        for ch in chunk.get("choices") or ():
            ids = ch.get("token_ids")
            if ids:
                if not self.response_ids:
                    self.first_token_at = time.monotonic()
                self.response_ids += ids
                self.token_versions += [self.policy_version] * len(ids)
            lp = ch.get("logprobs")
            if lp:
                self.logprobs += [float(item["logprob"]) for item in lp.get("content") or ()]
            delta = ch.get("delta")
            if not delta:
                if ch.get("finish_reason"):
                    self.finish_reason = ch["finish_reason"]
                    self.stop_reason = ch.get("stop_reason")
                continue
            text = delta.get("content")
            if text:
                self.content.append(text)
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if r:
                self.reasoning.append(r)
            for tc in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(
                    tc.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if ch.get("finish_reason"):
                self.finish_reason = ch["finish_reason"]
                self.stop_reason = ch.get("stop_reason")

    @property
    def version_varied(self) -> bool:
        return self._saw_version and len(set(self.token_versions)) > 1

    def usage_or_counted(self) -> dict[str, Any]:
        """Usage as the engine reported it, else counted from the token ids."""
        if self.usage:
            return self.usage
        p, c = len(self.prompt_ids), len(self.response_ids)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def completion(self) -> dict[str, Any]:
        """The full non-streaming `chat.completion` this stream amounts to."""
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            calls = []
            for i in sorted(self.tool_calls):
                tc = self.tool_calls[i]
                calls.append(
                    {
                        "id": tc["id"] or f"call_{self.id}_{i}",
                        "type": "function",
                        "function": dict(tc["function"]),
                    }
                )
            msg["tool_calls"] = calls
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": msg,
                    "finish_reason": self.finish_reason,
                    "stop_reason": self.stop_reason,
                    "logprobs": None,
                    "token_ids": self.response_ids,
                }
            ],
            "usage": self.usage_or_counted(),
            "prompt_token_ids": self.prompt_ids,
        }
