"""The name an engine serves a LoRA adapter under: `<served>-lora-v<N>`, the adapter pushed as
policy version N. Both engines serve the adapter by this name (vLLM's LoRA model name, listed in
its /v1/models), the gateway asks for the newest one an engine lists, and an answer's model name
says which adapter version served it (vLLM tags its answers with no version of its own)."""

from __future__ import annotations

import re

_NAME = re.compile(r"^(?P<served>.+)-lora-v(?P<version>\d+)$")


def adapter_model_name(served: str, version: int) -> str:
    return f"{served}-lora-v{int(version)}"


def adapter_version(name: str | None, served: str | None = None) -> int | None:
    """N of `<served>-lora-v<N>` (of any served name when `served` is None); None otherwise."""
    m = _NAME.match(name or "")
    if m is None or (served is not None and m["served"] != served):
        return None
    return int(m["version"])
