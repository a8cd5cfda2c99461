"""The engine a weight sync pushes to during training (module/weight_sync.py): its weight updates run inside a pause of the
rollout client's gateways, so no engine call starts while weights change ("drain" also lets the
calls in flight finish first), and the gateways learn the new policy version before they resume."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from polar_pl.engine.protocol import Engine

PauseMode = Literal["drain", "keep"]  # the gateway's (gateway/call/gate.py)


class Pausable(Protocol):
    """What a push pauses: the rollout client (every gateway it runs)."""

    def pause(self, mode: PauseMode) -> None: ...

    def resume(self) -> None: ...

    def set_policy_version(self, version: int) -> None: ...


class PausingEngine:
    """`engine`, with every weight update wrapped in a pause of `gateways()` (None: nothing to pause
    now, e.g. after the rollouts stopped). mode: "drain", "keep", or None (no pause; the gateways
    still learn the version)."""

    def __init__(
        self, engine: Engine, gateways: Callable[[], Pausable | None], mode: PauseMode | None
    ) -> None:
        self.engine, self._gateways, self.mode = engine, gateways, mode

    @property
    def url(self) -> str:
        return self.engine.url

    @property
    def base_url(self) -> str:
        return self.engine.base_url

    @property
    def urls(self) -> list[str]:
        return self.engine.urls

    @property
    def model(self) -> str:
        return self.engine.model

    @property
    def model_dir(self) -> Path | None:
        return self.engine.model_dir

    def start(self) -> PausingEngine:
        self.engine.start()
        return self

    def stop(self) -> None:
        self.engine.stop()

    def health(self) -> bool:
        return self.engine.health()

    def policy_version(self) -> int:
        return self.engine.policy_version()

    def set_policy_version(self, version: int) -> None:
        """vLLM's NCCL weight transfer moves weights past this handle, then tells it the version."""
        self.engine.set_policy_version(version)  # type: ignore[attr-defined]

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        return self._paused(self.engine.update_weights_from_state_dict, state_dict)

    def update_weights_from_disk(self, path: str) -> int:
        return self._paused(self.engine.update_weights_from_disk, path)

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: Mapping) -> int:
        return self._paused(self.engine.update_adapter, tensors, config)  # type: ignore[attr-defined]

    def update_adapter_from_disk(self, path: str) -> int:
        return self._paused(self.engine.update_adapter_from_disk, path)  # type: ignore[attr-defined]

    def _paused(self, update: Callable[..., int], *args: Any) -> int:
        gateways = self._gateways()
        if gateways is None:
            return update(*args)
        if self.mode is None:
            version = update(*args)
            gateways.set_policy_version(version)
            return version
        try:  # a drain that times out leaves the gateways paused: resume them all the same
            gateways.pause(self.mode)
            version = update(*args)
            gateways.set_policy_version(version)
            return version
        finally:
            gateways.resume()
