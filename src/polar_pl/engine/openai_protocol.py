"""Pydantic request models at the engine's HTTP boundary (OpenAI + vLLM extensions).

Unknown fields are accepted and ignored, as vLLM does, so SDK additions never break a request.
Responses are plain dicts built in `engine/serving.py`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar_pl.engine.backend import SamplingParams
from polar_pl.engine.constrain import ToolCallGrammar


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Base):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _SamplingFields(_Base):
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=128)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        return [v] if isinstance(v, str) else v

    def _sampling(self, max_tokens: int, logprobs: int | None, skip_special_tokens: bool) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k in (None, 0) else self.top_k,
            seed=self.seed,
            n=self.n,
            stop=tuple(s for s in (self.stop or []) if s),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
        )


class ChatCompletionRequest(_SamplingFields):
    messages: list[Any]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v):
        if isinstance(v, str) and v not in ("none", "auto", "required"):
            raise ValueError("tool_choice must be 'none', 'auto', 'required' or a named function")
        if isinstance(v, dict) and not isinstance((v.get("function") or {}).get("name"), str):
            raise ValueError("a named tool_choice must be {'type': 'function', 'function': {'name': ...}}")
        return v

    def effective_tool_choice(self) -> str | dict[str, Any]:
        """vLLM's default: 'auto' when tools are given, else 'none'."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def uses_tool_parser(self) -> bool:
        return bool(self.tools) and self.effective_tool_choice() != "none"

    def named_tool(self) -> str | None:
        choice = self.tool_choice
        return choice["function"]["name"] if isinstance(choice, dict) else None

    def forced_tool_names(self) -> list[str] | None:
        """The tools a call is forced from (tool_choice "required" or named), else None.
        Raises ValueError for a forced choice the tools cannot satisfy."""
        choice = self.effective_tool_choice()
        if choice not in ("required",) and not isinstance(choice, dict):
            return None
        names = [t["function"]["name"] for t in self.tools or [] if isinstance(t.get("function"), dict)]
        if not names:
            raise ValueError("tool_choice 'required' or a named function needs `tools`")
        named = self.named_tool()
        if named is None:
            return names
        if named not in names:
            raise ValueError(f"tool_choice names {named!r}, which is not in `tools`")
        return [named]

    def sampling_params(self, max_tokens: int, reasoning: bool = False) -> SamplingParams:
        """reasoning: a reasoning parser splits <think> off, so a forced tool call starts after it."""
        top = (self.top_logprobs or 0) if self.logprobs else None
        # vLLM's hermes parser turns skip_special_tokens off whenever it may parse tool calls, so
        # that <tool_call> survives detokenization even where it is a special token.
        skip = self.skip_special_tokens and not self.uses_tool_parser()
        params = self._sampling(max_tokens, top, skip)
        forced = self.forced_tool_names()
        if forced is None:
            return params
        grammar = ToolCallGrammar.for_tools(forced, self.named_tool() is not None, after_think=reasoning)
        return replace(params, tool_grammar=grammar)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        return self._sampling(max_tokens, self.logprobs, self.skip_special_tokens)


class UpdateWeightsFromDiskRequest(_Base):
    path: str
    policy_version: int | None = None


ErrorType = Literal["BadRequestError", "NotFoundError", "InternalServerError"]


class TokenizeRequest(_Base):
    """vLLM's /tokenize: a completion prompt (`prompt`) or a chat (`messages`, rendered with the
    chat template the way /v1/chat/completions renders it)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Any] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None  # vLLM: True for a prompt, False for a chat
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Base):
    model: str | None = None
    tokens: list[int]
