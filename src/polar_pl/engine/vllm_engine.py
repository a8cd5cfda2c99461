"""VLLMEngine: vLLM's OpenAI server behind the `Engine` handle, launched or connected to.

Launch: `python -m vllm.entrypoints.openai.api_server` from a separate vLLM environment
(vLLM pins its own transformers; see `vllm_python` for where it is looked for), with the hermes
tool parser and dev mode on. Connect: pass `url=` and nothing is launched.

Weights and versions use what vLLM 0.32 serves with VLLM_SERVER_DEV_MODE=1:
- from disk: `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`
  (in-place reload through the model loader, CPU and GPU), `POST /reset_prefix_cache` (cached
  prompt KV was computed by the old weights), then `POST /update_weight_version {"new_version": "<v>"}`;
- version: `GET /weight_info` -> {"weight_version": "<v>"} (vLLM reports no version per answer,
  so the gateway tags records with this handle's version);
- from a state dict: written to a temporary safetensors directory, then as from disk. The NCCL /
  IPC routes (init_weight_transfer_engine, start/update/finish_weight_update) are the GPU path and
  belong to the weight-sync work.

LoRA (`max_lora_rank` set: `--enable-lora`, VLLM_ALLOW_RUNTIME_LORA_UPDATING): an adapter push is
copied into a folder of this handle's own (vLLM reads an adapter's files again when it evicts it
from its cache and a request brings it back), loaded with `POST /v1/load_lora_adapter` under the
name `<served>-lora-v<version>`, and the adapter before the previous one is unloaded (the
previous one stays for requests still running on it). `model` is then the new adapter's name:
requests must ask for it, vLLM serves the base under the served name.

Every push is checked here, on the trainer's side, before anything is sent (engine/weights.py,
engine/adapter.py `check_adapter`): names and shapes against the served checkpoint's headers
(`model_dir`; unknown for an engine reached by URL alone), floating point, finite values. A push
that fails raises ValueError and vLLM receives no request: a reload that fails part-way would
leave it half-loaded, and it loads NaN weights without a word.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import httpx
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from polar_pl.engine.adapter import check_adapter
from polar_pl.engine.process import ServerProcess, healthy
from polar_pl.engine.weights import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    TensorSpec,
    check_folder,
    check_tensors,
    checkpoint_specs,
    load_adapter,
    save_adapter,
    save_state_dict,
)
from polar_pl.utils.adapters import adapter_model_name
from polar_pl.utils.serving import free_port

# vLLM's allowed --max-lora-rank values (vllm/config/lora.py)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

NO_VLLM = (
    "no Python with vLLM found: set engine.python, or $POLAR_VLLM_PYTHON (`make vllm-env` builds "
    ".venv-vllm), or put an environment with vLLM's `vllm` script on PATH"
)


def vllm_python() -> str | None:
    """The interpreter that runs vLLM, for `engine.python: null`: $POLAR_VLLM_PYTHON, else this
    interpreter if it imports vllm, else the one behind a `vllm` script on PATH; None if none."""
    if configured := os.environ.get("POLAR_VLLM_PYTHON"):
        return configured
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    script = shutil.which("vllm")
    if script is None:
        return None
    with open(script, "rb") as f:
        first = f.readline().decode(errors="replace")
    python = first[2:].strip().split()[0] if first.startswith("#!") and first[2:].strip() else ""
    return python if python and Path(python).exists() else None


def vllm_installed() -> bool:
    """Whether `vllm_python()` names an interpreter that exists (tests and benches skip otherwise)."""
    python = vllm_python()
    return python is not None and Path(python).exists()


class VLLMEngine:
    """See module docstring."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        url: str | None = None,
        served_model_name: str = "tiny",
        host: str = "127.0.0.1",
        port: int | None = None,
        python: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = 32768,
        enforce_eager: bool = True,
        reasoning_parser: str | None = None,
        logprobs_mode: str = "processed_logprobs",
        extra_args: list[str] | tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 600.0,
        max_lora_rank: int | None = None,
        tensor_parallel_size: int = 1,
    ):
        if model_dir is None and url is None:
            raise ValueError("VLLMEngine needs engine.model_dir (to launch) or engine.url (to connect)")
        if max_lora_rank is not None and not 1 <= int(max_lora_rank) <= LORA_RANKS[-1]:
            raise ValueError(
                f"engine.max_lora_rank={max_lora_rank}: 1 to {LORA_RANKS[-1]}, or null (no LoRA)"
            )
        if (
            isinstance(tensor_parallel_size, bool)
            or not isinstance(tensor_parallel_size, int)
            or tensor_parallel_size < 1
        ):
            raise ValueError(
                f"engine.tensor_parallel_size={tensor_parallel_size!r}: a positive number of GPUs"
            )
        self.tensor_parallel_size = tensor_parallel_size
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self._url = url.rstrip("/") if url else None
        self.served_model_name = served_model_name
        self.host = host
        self.port = port
        self.python = python or vllm_python()
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.reasoning_parser = reasoning_parser
        self.logprobs_mode = logprobs_mode
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.max_lora_rank = max_lora_rank
        self._proc: ServerProcess | None = None
        self._version = 0
        self._adapters: list[tuple[str, Path]] = []  # (name, folder) loaded, oldest first
        self._adapter_root: Path | None = None
        self._specs: dict[str, TensorSpec] | None = None  # the checkpoint's, read on the first push

    @property
    def url(self) -> str:
        return self._url or f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def urls(self) -> list[str]:
        return [self.url]

    @property
    def model(self) -> str:
        """The name to request: the newest adapter's once one is loaded, else the served name."""
        return self._adapters[-1][0] if self._adapters else self.served_model_name

    def command(self) -> list[str]:
        if self.python is None:
            raise FileNotFoundError(NO_VLLM)
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_model_name,
            "--host", self.host, "--port", str(self.port),
            "--dtype", self.dtype,
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            # logprobs of the distribution sampled (after temperature / top-k / top-p), as the
            # embedded engine reports them and the trainer rebuilds them
            "--logprobs-mode", self.logprobs_mode,
        ]  # fmt: skip
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.tensor_parallel_size > 1:  # one server over that many GPUs (of CUDA_VISIBLE_DEVICES)
            cmd += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.reasoning_parser:
            cmd += ["--reasoning-parser", self.reasoning_parser]
        if self.enforce_eager:  # skips torch.compile warm-up: minutes on a small CPU
            cmd.append("--enforce-eager")
        if self.max_lora_rank is not None:
            rank = next(r for r in LORA_RANKS if r >= int(self.max_lora_rank))
            # two adapters at once: the newest, and the one before it for requests still running on it
            cmd += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2", "--max-cpu-loras", "2"]
        return cmd + self.extra_args

    def start(self) -> Self:
        if self._url is not None:
            if not healthy(self._url, timeout=10):
                raise RuntimeError(f"no healthy vLLM server at {self._url}")
            self._version = self._read_version()
            return self
        if self.python is None:
            raise FileNotFoundError(NO_VLLM)
        if not Path(self.python).exists():
            raise FileNotFoundError(
                f"engine.python: vLLM python not found: {self.python} (or set $POLAR_VLLM_PYTHON)"
            )
        assert self.model_dir is not None  # __init__: no url means a model_dir
        if not (self.model_dir / "config.json").exists():
            raise FileNotFoundError(f"engine.model_dir: no config.json in {self.model_dir}")
        self.port = self.port or free_port(self.host)
        cache_root = Path(tempfile.gettempdir()) / "polar-vllm-cache"
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(cache_root)),
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            **({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if self.max_lora_rank is not None else {}),
            **self.env,
        }
        # The vLLM venv must not import this project's packages through an inherited PYTHONPATH.
        env.pop("PYTHONPATH", None)
        self._proc = ServerProcess(self.command(), self.url, env=env, name="vllm")
        self._proc.start(self.startup_timeout)
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
            self._adapter_root, self._adapters = None, []

    def health(self) -> bool:
        return healthy(self.url)

    def policy_version(self) -> int:
        return self._version

    def set_policy_version(self, version: int) -> None:
        """Record a version reached by another path (the NCCL/IPC weight-transfer routes)."""
        r = httpx.post(f"{self.url}/update_weight_version", json={"new_version": str(version)}, timeout=60)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM update_weight_version failed ({r.status_code}): {r.text[:500]}")
        self._version = version

    def _read_version(self) -> int:
        try:
            r = httpx.get(f"{self.url}/weight_info", timeout=10)
            return int(r.json()["weight_version"]) if r.status_code == 200 else 0
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            return 0

    def specs(self) -> dict[str, TensorSpec] | None:
        """What a pushed tensor must be: the served checkpoint's names and shapes (None: no model_dir)."""
        if self._specs is None and self.model_dir is not None:
            self._specs = checkpoint_specs(self.model_dir)
        return self._specs

    def update_weights_from_disk(self, path: str) -> int:
        check_folder(path, self.specs())
        return self._reload_folder(path)

    def _reload_folder(self, path: str) -> int:
        with tempfile.TemporaryDirectory(prefix="polar-reload-") as tmp:
            weights_dir = with_tied_lm_head(Path(path), Path(tmp)) if self._tied() else Path(path)
            return self._reload(weights_dir)

    def _tied(self) -> bool:
        if self.model_dir is None:
            return False
        config = json.loads((self.model_dir / "config.json").read_text())
        return bool(config.get("tie_word_embeddings", False))

    def _reload(self, path: Path) -> int:
        self._unload_adapters(keep=0)  # new base weights: the adapters trained on the old ones go
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}, "timeout": 600}
        r = httpx.post(f"{self.url}/collective_rpc", json=rpc, timeout=660)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM reload_weights failed ({r.status_code}): {r.text[:500]}")
        # Cached prompt blocks hold KV computed by the old weights; a prefix-cache hit would mix them in.
        r = httpx.post(f"{self.url}/reset_prefix_cache", timeout=60)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM reset_prefix_cache failed ({r.status_code}): {r.text[:500]}")
        version = self._version + 1
        r = httpx.post(f"{self.url}/update_weight_version", json={"new_version": str(version)}, timeout=60)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM update_weight_version failed ({r.status_code}): {r.text[:500]}")
        self._version = version
        return version

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        check_tensors(state_dict, self.specs())
        with tempfile.TemporaryDirectory(prefix="polar-weights-") as tmp:
            save_state_dict(state_dict, Path(tmp))
            return self._reload_folder(tmp)

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: Mapping) -> int:
        """A LoRA adapter (PEFT names, adapter_config.json's content), written where vLLM reads it."""
        check_adapter(tensors, config, self.specs())
        folder = self._adapter_folder()
        save_adapter(tensors, config, folder)
        return self._load_adapter(folder)

    def update_adapter_from_disk(self, path: str) -> int:
        """A PEFT adapter folder, copied into this handle's own (the caller may remove its copy)."""
        check_adapter(*load_adapter(path), self.specs())  # FileNotFoundError naming a missing file
        folder = self._adapter_folder()
        folder.mkdir(parents=True)
        for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
            shutil.copy(Path(path) / name, folder / name)
        return self._load_adapter(folder)

    def _unload_adapters(self, keep: int) -> None:
        while len(self._adapters) > keep:
            old, old_folder = self._adapters.pop(0)
            r = httpx.post(f"{self.url}/v1/unload_lora_adapter", json={"lora_name": old}, timeout=60)
            if r.status_code != 200:
                raise RuntimeError(f"vLLM unload_lora_adapter {old} failed ({r.status_code}): {r.text[:500]}")
            shutil.rmtree(old_folder, ignore_errors=True)

    def _adapter_folder(self) -> Path:
        if self.max_lora_rank is None and self._url is None:
            raise RuntimeError(
                "VLLMEngine: LoRA adapters need engine.max_lora_rank (vLLM's --enable-lora); it is null"
            )
        if self._adapter_root is None:
            self._adapter_root = Path(tempfile.mkdtemp(prefix="polar-vllm-lora-"))
        return self._adapter_root / f"v{self._version + 1}"

    def _load_adapter(self, folder: Path) -> int:
        version = self._version + 1
        name = adapter_model_name(self.served_model_name, version)
        body = {"lora_name": name, "lora_path": str(folder)}
        r = httpx.post(f"{self.url}/v1/load_lora_adapter", json=body, timeout=600)
        if r.status_code != 200:
            shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"vLLM load_lora_adapter failed ({r.status_code}): {r.text[:500]}")
        self._adapters.append((name, folder))
        self._unload_adapters(keep=2)  # the newest and the one before it
        r = httpx.post(f"{self.url}/update_weight_version", json={"new_version": str(version)}, timeout=60)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM update_weight_version failed ({r.status_code}): {r.text[:500]}")
        self._version = version
        return version

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def with_tied_lm_head(src: Path, out: Path) -> Path:
    """A reload directory whose checkpoint names lm_head.weight explicitly.

    vLLM 0.32's in-place reload re-materializes the tied ParallelLMHead as its own layer; a HF
    checkpoint of a tied model has no lm_head.weight, so the head silently keeps the OLD weights
    ("ParallelLMHead: Failed to load weights" in its log). Giving the head the new embedding
    matrix under its own name loads it. The shards are linked, not copied; an index file is left
    out because vLLM would filter the extra shard by it.
    """
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {src}")
    embed, has_head = None, False
    for f in files:
        (out / f.name).symlink_to(f.resolve())
        with safe_open(str(f), framework="pt") as st:
            names = set(st.keys())
            has_head |= "lm_head.weight" in names
            if "model.embed_tokens.weight" in names:
                embed = st.get_tensor("model.embed_tokens.weight")
    if embed is not None and not has_head:
        save_file({"lm_head.weight": embed.contiguous()}, str(out / "zz-tied-lm-head.safetensors"))
    return out
