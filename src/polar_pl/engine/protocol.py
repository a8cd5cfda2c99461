"""The engine handle the rest of the system holds: where the engine serves, whether it is healthy,
which policy version it runs, and how to push new weights to it.

Two implementations, chosen in Hydra with `_target_` (conf/engine/*.yaml):
- `polar_pl.engine.embedded.EmbeddedEngine`: the transformers engine of this package, in-process
  (a server thread) or as a subprocess;
- `polar_pl.engine.vllm.VLLMEngine`: vLLM's OpenAI server, launched from a vLLM environment or
  connected to by URL.

Both serve the same HTTP contract (docs/architecture.md, "Engine contract"), so the gateway only needs
`base_url` and `model`. Both also take LoRA adapters (`AdapterEngine`): the trainer pushes only
the adapter, and the engine serves it as `<served>-lora-v<version>` (utils/adapters.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Engine(Protocol):
    """An inference engine serving the engine contract over HTTP."""

    @property
    def url(self) -> str:
        """Root URL (`http://host:port`); valid after start()."""

    @property
    def base_url(self) -> str:
        """OpenAI SDK base URL (`url + "/v1"`); valid after start()."""

    @property
    def model(self) -> str:
        """The model name requests must carry."""

    @property
    def urls(self) -> list[str]:
        """Every root URL a gateway may route to: one engine's own, or each replica's in rotation."""

    @property
    def model_dir(self) -> Path | None:
        """The HF folder served (gateways render token-faithful prompts with its tokenizer); None
        when not known here (an engine reached by URL)."""

    def start(self) -> Engine:
        """Called once by the owner (train.py, a test) before any request; blocks until healthy."""

    def stop(self) -> None:
        """Called once at teardown (in `finally`); idempotent, never raises for a dead engine."""

    def health(self) -> bool:
        """Called by supervisors: True when GET /health answers 200."""

    def policy_version(self) -> int:
        """The weights version answers are sampled with now (0 = the initial checkpoint)."""

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Called by the trainer after an optimizer step with HF-named tensors; returns the new
        policy version. Requests admitted afterwards sample with the new weights."""

    def update_weights_from_disk(self, path: str) -> int:
        """Called with a directory of *.safetensors (HF names); returns the new policy version."""


@runtime_checkable
class AdapterEngine(Engine, Protocol):
    """An engine that serves LoRA adapters pushed in PEFT's format over its base weights."""

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: Mapping) -> int:
        """Called by the trainer after an optimizer step with the adapter's A / B tensors (PEFT
        names, `base_model.model.<module>.lora_A.weight`) and adapter_config.json's content;
        returns the new policy version. Requests admitted afterwards are served by this adapter,
        under the name `<served>-lora-v<version>` (what `model` returns from then on)."""

    def update_adapter_from_disk(self, path: str) -> int:
        """Called with a PEFT adapter folder (adapter_model.safetensors, adapter_config.json);
        returns the new policy version, as `update_adapter`."""
