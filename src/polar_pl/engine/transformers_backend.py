"""TransformersBackend: the real model (transformers, CPU or GPU) behind the engine server.

Generation runs on the scheduler thread (`engine/scheduler.py`), which batches every active
sequence into one forward pass per step. Weight updates run on that same thread between steps and
bump the policy version; tokens sampled afterwards carry the new version. A LoRA adapter push is
merged into the weights (engine/adapter.py); the engine then serves it as
`<served>-lora-v<version>` (`adapter_version`), and a full push drops it.

A push is checked whole before any weight changes (engine/weights.py, engine/adapter.py): one that
fails raises ValueError and leaves the weights, the version and the prefix cache as they were.
The engine holds one merged adapter, so a request naming an older one is refused (404
`model_not_found`, as vLLM answers for an adapter it does not hold) when it is admitted to the
batch, on the thread that applies pushes: no request named after one adapter starts on another's
weights. A request already running when a push lands goes on with the new weights, and its later
tokens carry the new version.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from polar_pl.engine.adapter import AdapterMerge
from polar_pl.engine.backend import BackendStats, GenerationRequest, SeqDelta
from polar_pl.engine.errors import model_not_found
from polar_pl.engine.scheduler import Scheduler
from polar_pl.engine.weights import check_tensors, load_adapter, load_state_dict, model_specs
from polar_pl.utils.adapters import adapter_model_name, adapter_version


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_threads() -> int:
    """Half the cores, at most 8: vLLM's CPU build likewise keeps cores free for its server."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class TransformersBackend:
    """GenerationBackend over a HF causal LM directory.

    dtype: None = float32 on CPU (what vLLM's CPU build is checked against), the checkpoint's dtype
    on GPU.
    num_threads: torch intra-op threads of the scheduler thread (which runs every forward pass);
    set on that thread only, so the caller's (the trainer's) setting is left alone; None keeps
    torch's default.
    prefix_cache_mb: memory for recent prompts' KV, reused by prompts that start with them
    (engine/kvcache.py); 0 turns prefix caching off.
    fast_decoder: run the engine's own forward (engine/decoder.py) where it covers the model;
    False keeps transformers' forward (the reference the tests compare it with).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_name: str | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        max_model_len: int | None = None,
        max_batch_size: int = 64,
        prefill_chunk: int = 2048,
        num_threads: int | None = None,
        prefix_cache_mb: int = 512,
        fast_decoder: bool = True,
    ):
        self.model_dir = Path(model_dir)
        self.model_name = model_name or str(model_dir)
        self.device = torch.device(device) if device is not None else default_device()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        if dtype is None:
            dtype = torch.float32 if self.device.type == "cpu" else "auto"
        elif isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=dtype)
        self.model = model.to(self.device)  # type: ignore[arg-type]  # transformers' decorated .to loses self
        self.model.eval()
        config_len = getattr(self.model.config, "max_position_embeddings", None) or 32768
        self.max_model_len = min(max_model_len or config_len, config_len)
        eos = self.tokenizer.eos_token_id
        self.eos_token_ids: tuple[int, ...] = (eos,) if eos is not None else ()
        # vLLM stops on the generation config's other EOS ids too, reporting them as stop tokens.
        self.default_stop_token_ids = tuple(i for i in _generation_eos(self.model_dir) if i != eos)
        self.policy_version = 0
        self.adapter_version: int | None = None  # the policy version of the merged adapter; None: none
        self._merge: AdapterMerge | None = None
        self._specs = model_specs(self.model)  # what a pushed tensor must be (shapes never change)
        self.stats = BackendStats()
        self._version_lock = threading.Lock()
        self._scheduler = Scheduler(
            self.model,
            self.tokenizer,
            self.eos_token_ids,
            self.stats,
            max_batch_size=max_batch_size,
            prefill_chunk=prefill_chunk,
            version=lambda: self.policy_version,
            # Oversubscribed intra-op threads make small CPU kernels crawl (a decode step of the
            # tiny model: ~40 ms with 2 threads on a busy 2-core box, ~3 ms with 1).
            num_threads=num_threads,
            prefix_cache_bytes=prefix_cache_mb << 20,
            admit_check=self._check_adapter,
            fast_decoder=fast_decoder,
        )
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._scheduler.start()
            self._started = True

    def close(self) -> None:
        if self._started:
            self._scheduler.stop()
            self._started = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[list[SeqDelta]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        self._scheduler.submit(request, lambda item: loop.call_soon_threadsafe(queue.put_nowait, item))
        done = False
        try:
            while True:
                item = await queue.get()
                if item is None:
                    done = True
                    return
                if isinstance(item, BaseException):
                    done = True
                    raise item
                yield item
        finally:
            if not done:
                self._scheduler.abort(request.request_id)

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        check_tensors(state_dict, self._specs)  # before the scheduler stops for it: a refusal costs no step
        return self._scheduler.run_exclusive(lambda: self._load(state_dict))

    def update_weights_from_disk(self, path: str) -> int:
        return self.update_weights_from_state_dict(load_state_dict(path))

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: Mapping) -> int:
        """Merge a LoRA adapter (PEFT names and adapter_config.json's content) into the base
        weights; returns the new policy version, which is also the adapter's."""
        return self._scheduler.run_exclusive(lambda: self._apply_adapter(tensors, config))

    def update_adapter_from_disk(self, path: str) -> int:
        return self.update_adapter(*load_adapter(path))

    def _apply_adapter(self, tensors: Mapping[str, torch.Tensor], config: Mapping) -> int:
        if self._merge is None:
            self._merge = AdapterMerge(self.model)
        self._merge.apply(tensors, config)
        return self._bump(adapter=True)

    def _check_adapter(self, request: GenerationRequest) -> None:
        """Called by the scheduler as it admits `request`: one naming an adapter other than the one
        merged now is refused (see module docstring)."""
        if request.adapter is None or adapter_version(request.adapter) == self.adapter_version:
            return
        served = request.adapter.rsplit("-lora-v", 1)[0]
        held = [served] + ([adapter_model_name(served, self.adapter_version)] if self.adapter_version else [])
        raise model_not_found(request.adapter, held)

    def _bump(self, *, adapter: bool) -> int:
        self._scheduler.prefix_cache.clear()  # KV computed by the old weights
        self.stats.extra.update(self._scheduler.prefix_cache.stats())
        with self._version_lock:
            self.policy_version += 1
            self.adapter_version = self.policy_version if adapter else None
            return self.policy_version

    def _load(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        # checked by update_weights_from_state_dict; state_dict names tied weights under both
        # names (lm_head.weight and embed_tokens.weight)
        params = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in state_dict.items():
                target = params[name]
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        self._merge = None  # these weights are the base of the next adapter push
        return self._bump(adapter=False)


def _generation_eos(model_dir: Path) -> tuple[int, ...]:
    try:
        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except OSError:
        return ()
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list | tuple) else (eos,)
