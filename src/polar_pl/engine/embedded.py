"""EmbeddedEngine: the transformers engine of this package behind the `Engine` handle.

reasoning_parser: None or "qwen3", as vLLM's `--reasoning-parser` (chat/reasoning.py).
mode="thread": model and server live in this process (uvicorn on a thread); weight updates from
a state dict are a direct in-memory copy, no serialization.
mode="subprocess": `polar-pl engine` in a child process (isolates the GIL from the trainer);
state-dict updates go through a safetensors directory and POST /update_weights_from_disk.
Either way the weight route needs `admin_token` (made per engine; the child reads it from its
environment, not its command line). LoRA adapters (PEFT format) are merged into the base weights
(engine/adapter.py); afterwards `model` is the adapter's name, `<served>-lora-v<version>`.
A push the engine refuses (a folder or state dict that fails its check, engine/weights.py) raises
ValueError with the engine's reason, in either mode, and changes nothing: not the engine's weights
or version, nor `model`.

fast_decoder: the engine's own forward where it covers the model (engine/decoder.py), else
transformers'.

num_threads sets torch's intra-op threads of the engine's scheduler thread only (torch keeps that
setting per thread), so in thread mode the trainer's own torch threads are not changed; the two
still share the CPU cores, so on a small machine keep their sum at or below the core count.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Self

import httpx
import torch

from polar_pl.engine.process import ServerProcess, healthy
from polar_pl.engine.weights import save_adapter, save_state_dict
from polar_pl.utils import metrics, tokens
from polar_pl.utils.adapters import adapter_model_name
from polar_pl.utils.serving import ServerThread, free_port

if TYPE_CHECKING:
    from polar_pl.engine.transformers_backend import TransformersBackend

# transformers builds a model under a process-global meta-device context: two replicas loading on
# two threads at once broke with "Cannot copy out of meta tensor".
_LOAD_LOCK = threading.Lock()


class EmbeddedEngine:
    """See module docstring. Construct cheaply; `start()` loads the model."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        served_model_name: str = "tiny",
        host: str = "127.0.0.1",
        port: int | None = None,
        mode: Literal["thread", "subprocess"] = "thread",
        device: str | None = None,
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        num_threads: int | None = None,
        reasoning_parser: str | None = None,
        startup_timeout: float = 300.0,
        prefix_cache_mb: int = 512,
        metrics_token: str | None = None,
        fast_decoder: bool = True,
    ):
        from polar_pl.chat.reasoning import check_reasoning_parser

        if mode not in ("thread", "subprocess"):
            raise ValueError(f"engine.mode must be 'thread' or 'subprocess', got {mode!r}")
        self.model_dir = Path(model_dir)
        self.served_model_name = served_model_name
        self.host = host
        self.port = port
        self.mode = mode
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.num_threads = num_threads
        self.reasoning_parser = check_reasoning_parser(reasoning_parser)
        self.startup_timeout = startup_timeout
        self.prefix_cache_mb = prefix_cache_mb
        self.metrics_token = metrics_token  # what GET /metrics needs (None: open)
        self.fast_decoder = fast_decoder
        self.admin_token = tokens.new_token()
        self.backend: TransformersBackend | None = None  # thread mode only
        self._thread: ServerThread | None = None
        self._proc: ServerProcess | None = None
        self._adapter_version: int | None = None  # subprocess mode: learnt from the adapter route

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def urls(self) -> list[str]:
        return [self.url]

    @property
    def model(self) -> str:
        """The name to request: the served name, or the pushed adapter's."""
        adapter = self.backend.adapter_version if self.backend is not None else self._adapter_version
        return (
            self.served_model_name if adapter is None else adapter_model_name(self.served_model_name, adapter)
        )

    def start(self) -> Self:
        if not (self.model_dir / "config.json").exists():
            raise FileNotFoundError(f"engine.model_dir: no config.json in {self.model_dir}")
        self.port = self.port or free_port(self.host)
        if self.mode == "thread":
            from polar_pl.engine.server import create_app
            from polar_pl.engine.transformers_backend import TransformersBackend

            with _LOAD_LOCK:
                self.backend = TransformersBackend(
                    self.model_dir,
                    model_name=self.served_model_name,
                    device=self.device,
                    max_batch_size=self.max_batch_size,
                    max_model_len=self.max_model_len,
                    num_threads=self.num_threads,
                    prefix_cache_mb=self.prefix_cache_mb,
                    fast_decoder=self.fast_decoder,
                )
            self._thread = ServerThread(
                create_app(
                    self.backend,
                    reasoning_parser=self.reasoning_parser,
                    admin_token=self.admin_token,
                    metrics_token=self.metrics_token,
                ),
                host=self.host,
                port=self.port,
            )
            self._thread.start(timeout=self.startup_timeout)
        else:
            cmd = [
                sys.executable,
                "-m",
                "polar_pl.cli",
                "engine",
                "--model",
                str(self.model_dir),
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--served-model-name",
                self.served_model_name,
                "--max-batch-size",
                str(self.max_batch_size),
            ]
            if self.device:
                cmd += ["--device", self.device]
            if self.max_model_len:
                cmd += ["--max-model-len", str(self.max_model_len)]
            if self.num_threads:
                cmd += ["--threads", str(self.num_threads)]
            cmd += ["--prefix-cache-mb", str(self.prefix_cache_mb)]
            if not self.fast_decoder:
                cmd += ["--no-fast-decoder"]
            if self.reasoning_parser:
                cmd += ["--reasoning-parser", self.reasoning_parser]
            env = os.environ | {tokens.ENV: self.admin_token}
            if self.metrics_token:  # like the admin token: off the command line
                env[metrics.TOKEN_ENV] = self.metrics_token
            self._proc = ServerProcess(cmd, self.url, env=env, name="embedded-engine")
            self._proc.start(self.startup_timeout)
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def health(self) -> bool:
        return healthy(self.url)

    def policy_version(self) -> int:
        if self.backend is not None:
            return self.backend.policy_version
        return int(httpx.get(f"{self.url}/policy_version", timeout=10).json()["policy_version"])

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        if self.backend is not None:
            return self.backend.update_weights_from_state_dict(state_dict)
        with tempfile.TemporaryDirectory(prefix="polar-weights-") as tmp:
            save_state_dict(state_dict, Path(tmp))
            return self.update_weights_from_disk(tmp)

    def update_weights_from_disk(self, path: str) -> int:
        if self.backend is not None:
            return self.backend.update_weights_from_disk(path)
        version = int(self._post("/update_weights_from_disk", path)["policy_version"])
        self._adapter_version = None  # only now: a refused push leaves the adapter served
        return version

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: Mapping) -> int:
        """A LoRA adapter (PEFT names, adapter_config.json's content), merged into the base."""
        if self.backend is not None:
            return self.backend.update_adapter(tensors, config)
        with tempfile.TemporaryDirectory(prefix="polar-adapter-") as tmp:
            save_adapter(tensors, config, Path(tmp))
            return self.update_adapter_from_disk(tmp)

    def update_adapter_from_disk(self, path: str) -> int:
        """A PEFT adapter folder (adapter_model.safetensors, adapter_config.json)."""
        if self.backend is not None:
            return self.backend.update_adapter_from_disk(path)
        version = int(self._post("/update_adapter_from_disk", path)["policy_version"])
        self._adapter_version = version
        return version

    def _post(self, route: str, path: str) -> dict:
        """POST {"path": path} to an admin route; ValueError with the engine's reason for a push it
        refused (400)."""
        r = httpx.post(
            f"{self.url}{route}",
            json={"path": str(path)},
            headers={"authorization": f"Bearer {self.admin_token}"},
            timeout=600,
        )
        if r.status_code == HTTPStatus.BAD_REQUEST:
            try:
                reason = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                reason = r.text[:2000]
            raise ValueError(f"the engine refused {route}: {reason}")
        r.raise_for_status()
        return r.json()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
