"""The token-generator contract behind the engine's HTTP server.

The server (`engine/server.py`) owns everything OpenAI-shaped: rendering chat messages to prompt
ids, request validation, tool-call parsing, SSE framing, errors. A backend only turns prompt ids
into sampled ids. Two backends implement `GenerationBackend`:

- `TransformersBackend` (`engine/transformers_backend.py`): the real model, every active sequence
  stepped together by a scheduler with a KV cache;
- `ScriptedBackend` (`polar_pl/testing/scripted.py`): a test double for the components around the engine
  (gateway, harness runs) answering with scripted assistant turns, rendered into real tokens.

Both share `SequenceOutput` (`engine/detok.py`) for detokenization and stop handling, so text,
token ids, finish reasons and stop reasons come out the same way from either.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from polar_pl.engine.constrain import ToolCallGrammar


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling settings (vLLM semantics).

    logprobs: None = no logprobs; k >= 0 = the sampled token's logprob plus the top k alternatives.
    stop: stop strings; the text is cut before them (the token ids are not cut, as in vLLM).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # tool_choice "required" / named: the output is held to forced hermes tool calls
    tool_grammar: ToolCallGrammar | None = None


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One request handed to a backend. `chat` is the validated chat body (None for token-in
    completions); only the scripted backend looks at it. `adapter`: the LoRA adapter the request
    named (`<served>-lora-v<N>`), which must still be the one served when it is admitted."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    chat: Mapping[str, Any] | None = None
    adapter: str | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The sampled token's logprob and the top alternatives, best first: ((id, logprob), ...)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class SeqDelta:
    """What one choice produced since its last delta.

    text: newly decoded text (held back while it could still be part of a stop string).
    finish_reason: None while running, else "stop" | "length" | "abort".
    stop_reason: the stop string or stop token id that ended it (None for EOS or length).
    policy_version: the weights version that sampled these tokens.
    """

    index: int
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    policy_version: int = 0


@dataclass(slots=True)
class BackendStats:
    """Counters exposed at GET /stats (and used by tests to prove batching)."""

    steps: int = 0
    tokens_generated: int = 0
    max_batch_size: int = 0
    multi_seq_steps: int = 0
    requests: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class GenerationBackend(Protocol):
    """Turns prompt ids into sampled ids. Implementations must be safe to call from the server's
    event loop; heavy work runs on their own thread."""

    tokenizer: Any
    model_name: str
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    default_stop_token_ids: tuple[int, ...]
    policy_version: int
    stats: BackendStats

    def start(self) -> None:
        """Called once by the server's lifespan before the first request."""

    def close(self) -> None:
        """Called once at shutdown; aborts what is still running."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[list[SeqDelta]]:
        """Called per request; yields batches of deltas (one per choice that advanced) until every
        choice has a finish_reason. Closing the iterator early aborts the request."""

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Load new weights (applied between decode steps); returns the new policy version."""

    def update_weights_from_disk(self, path: str) -> int:
        """Load new weights from a model directory (safetensors); returns the new policy version."""
