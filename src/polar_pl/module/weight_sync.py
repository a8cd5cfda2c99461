"""Weight push from the trainer to the inference engine, behind one Protocol.

A sync object is built by config without an engine (the datamodule owns the engine) and bound
later: `GRPOModule.on_fit_start` binds `trainer.datamodule.engine` when the sync has none, or the
owner calls `sync.bind(engine)`. The module calls `push(model)` after every `push_every`-th
optimiser step; each push bumps the engine's policy version, so later samples carry it.

Implementations:
- `EmbeddedStateDictSync`: `engine.update_weights_from_state_dict` (in-process copy for the
  embedded engine in thread mode; a safetensors round trip otherwise);
- `DiskSync`: safetensors into a directory, then `engine.update_weights_from_disk` (the embedded
  engine, and vLLM on CPU or any engine without a collective);
- `VLLMWeightTransferSync`: vLLM's native weight-transfer routes (init / start / update / finish)
  over NCCL or CUDA IPC. GPU only; see its docstring for what is and is not exercised;
- `NoSync`: pushes nothing (the control run, `module/weight_sync=none`): weights and version stay put.

With LoRA (`module.lora`) the module pushes its `PeftModel`, and `EmbeddedStateDictSync` and
`DiskSync` send the adapter alone: its A / B tensors and adapter_config.json, in memory
(`engine.update_adapter`) or as a PEFT folder (`engine.update_adapter_from_disk`); the engine
serves base + adapter (`<served>-lora-v<version>`). For SmolLM2-135M at rank 16 on every linear
layer that is 19.6 MB instead of 651 MB, and into vLLM's CPU build 0.5 s instead of 5.7 s
(bench/push.py). `pushes_adapters` says a sync can.

A push is checked whole before any weight changes (engine/weights.py): one the engine refuses (a
tensor of the wrong shape or dtype, NaN or inf) raises ValueError and leaves the engine serving
what it served, under the same version. `VLLMWeightTransferSync` checks the parameters are finite
before it sends anything.

Sharded training (`trainer.strategy=fsdp`, module/sharding.py): rank 0 pushes, gathering each
tensor as it reaches it (module/gather.py), and every other rank runs `follow(model)`, the same
gathers with nothing kept. `DiskSync` writes the gathered tensors in files of at most 1 GiB as they
come, so rank 0 holds no whole extra copy of the model; `EmbeddedStateDictSync` hands the engine
one whole state dict (the in-process engine checks a push whole before loading it).
`VLLMWeightTransferSync` does not gather shards: under FSDP use `module/weight_sync=disk`.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, TypeGuard, cast, runtime_checkable

import httpx
import torch
from torch import nn

from polar_pl.engine.protocol import AdapterEngine, Engine
from polar_pl.engine.weights import check_tensors, save_adapter
from polar_pl.module.gather import INDEX, drain, full_tensors, write_safetensors

if TYPE_CHECKING:
    from peft import PeftModel


@runtime_checkable
class WeightSync(Protocol):
    """Moves the trainer's weights into the engine."""

    engine: Engine | None
    pushed_bytes: int  # what the last push moved (tensor bytes); 0 when nothing or not known
    pushes_adapters: bool  # whether push() takes a PeftModel and sends its adapter alone

    def bind(self, engine: Engine) -> Self:
        """Called once when the engine is known, before the first push; returns self."""

    def push(self, model: nn.Module) -> int:
        """Called after an optimiser step (every `push_every`); returns the engine's policy version
        afterwards. Requests admitted after it returns sample with the new weights. `model` is a
        PEFT `PeftModel` when the module trains LoRA (only syncs with `pushes_adapters` get one)."""

    def policy_version(self) -> int:
        """The engine's current policy version (the reference for staleness)."""

    def close(self) -> None:
        """Called at teardown; idempotent. Does not stop the engine (its owner does)."""

    def follow(self, model: nn.Module) -> None:
        """Called on every rank but 0 while rank 0 pushes a sharded `model`: joins the gathers
        that push runs (the same tensors in the same order), keeping nothing."""


def hf_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """HF-named, fully materialised, detached tensors of `model` (FSDP DTensors are gathered,
    a collective every rank must join), optionally cast to `dtype`."""
    return dict(full_tensors(model, dtype))


def is_adapter(model: nn.Module) -> TypeGuard[PeftModel]:
    """Whether `model` is a PEFT model, whose push is its adapter alone."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def adapter_payload(model: PeftModel, dtype: torch.dtype | None) -> tuple[dict[str, torch.Tensor], dict]:
    """The adapter's (tensors, adapter_config.json content) as engines load it (inference mode)."""
    from polar_pl.module.lora import adapter_state

    tensors, config = adapter_state(model, dtype)
    return tensors, {**config, "inference_mode": True}


def nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"module.weight_sync.dtype={name!r}: not a torch dtype (e.g. bfloat16, float32)")
    return dt


class _Bound:
    """Shared engine binding."""

    engine: Engine | None = None
    pushed_bytes: int = 0
    pushes_adapters: bool = False

    def bind(self, engine: Engine) -> Self:
        self.engine = engine
        return self

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError(f"{type(self).__name__} has no engine: call bind(engine) before push()")
        return self.engine

    def policy_version(self) -> int:
        return int(self._engine().policy_version())

    def close(self) -> None:
        pass

    def follow(self, model: nn.Module) -> None:
        if is_adapter(model):
            adapter_payload(model, None)
        else:
            drain(full_tensors(model))


class EmbeddedStateDictSync(_Bound):
    """`engine.update_weights_from_state_dict(model.state_dict())`; a LoRA model's adapter with
    `engine.update_adapter(tensors, config)`."""

    pushes_adapters = True

    def __init__(self, engine: Engine | None = None, *, dtype: str | None = None):
        self.engine, self.dtype = engine, _dtype(dtype)

    def push(self, model: nn.Module) -> int:
        if is_adapter(model):
            tensors, config = adapter_payload(model, self.dtype)
            self.pushed_bytes = nbytes(tensors)
            return int(cast(AdapterEngine, self._engine()).update_adapter(tensors, config))
        state = hf_state_dict(model, self.dtype)
        self.pushed_bytes = nbytes(state)
        return int(self._engine().update_weights_from_state_dict(state))


class DiskSync(_Bound):
    """Safetensors (HF names) into `dir`, then `engine.update_weights_from_disk(dir)`.

    dir: where to write; None = a fresh temporary directory per push, removed afterwards.
    A given `dir` is emptied of *.safetensors before each write and keeps the last push.
    dtype: cast before writing (e.g. bfloat16 halves the bytes); None keeps the trainer's.
    Tensors are written as they are gathered, in files of at most 1 GiB (transformers' sharded
    layout), so the push holds one file's worth beyond the model.
    A LoRA model's push is a PEFT adapter folder, loaded with `engine.update_adapter_from_disk`.
    """

    pushes_adapters = True

    def __init__(self, engine: Engine | None = None, *, dir: str | None = None, dtype: str | None = None):
        self.engine, self.dir, self.dtype = engine, dir, _dtype(dtype)

    def push(self, model: nn.Module) -> int:
        engine = self._engine()
        write: Callable[[Path], int]
        if is_adapter(model):
            tensors, config = adapter_payload(model, self.dtype)
            write = functools.partial(_write_adapter, tensors, config)
            load = cast(AdapterEngine, engine).update_adapter_from_disk
        else:
            write = functools.partial(write_safetensors, full_tensors(model, self.dtype))
            load = engine.update_weights_from_disk
        if self.dir is None:
            with tempfile.TemporaryDirectory(prefix="polar-push-") as tmp:
                self.pushed_bytes = write(Path(tmp))
                return int(load(tmp))
        out = Path(self.dir)
        for old in (*out.glob("*.safetensors"), *out.glob(INDEX), *out.glob("adapter_config.json")):
            old.unlink()
        self.pushed_bytes = write(out)
        return int(load(str(out)))


def _write_adapter(tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any], out: Path) -> int:
    save_adapter(tensors, config, out)
    return nbytes(tensors)


class NoSync(_Bound):
    """Pushes nothing: the engine keeps its weights and its version (learning-sanity control)."""

    pushes_adapters = True  # nothing, full or adapter

    def __init__(self, engine: Engine | None = None):
        self.engine = engine

    def push(self, model: nn.Module) -> int:
        return self.policy_version() if self.engine is not None else 0

    def policy_version(self) -> int:
        return int(self.engine.policy_version()) if self.engine is not None else 0

    def follow(self, model: nn.Module) -> None:
        pass  # push gathers nothing


class VLLMRoutes:
    """vLLM's weight-sync control plane over HTTP (vllm/entrypoints/rl/online/api_router.py, served
    with VLLM_SERVER_DEV_MODE=1). Structurally a `vllm...VLLMWeightSyncClient`, so vLLM's own
    trainer-side engines drive it."""

    def __init__(self, url: str, timeout: float = 600.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def _post(self, route: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        r = httpx.post(f"{self.url}/{route}", json=body, timeout=self.timeout)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM /{route} failed ({r.status_code}): {r.text[:500]}")
        return r.json()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._post("init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self._post("start_weight_update")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        # IPC handles are not JSON: vLLM's own helper pickles them into base64.
        from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

        self._post("update_weights", {"update_info": _json_safe_update_payload(update_info)})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post("finish_weight_update", {"weight_version": weight_version} if weight_version else None)

    def pause(self, mode: str) -> None:
        r = httpx.post(f"{self.url}/pause", params={"mode": mode}, timeout=self.timeout)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM /pause failed ({r.status_code}): {r.text[:500]}")

    def resume(self) -> None:
        self._post("resume")

    def update_weight_version(self, version: int) -> None:
        self._post("update_weight_version", {"new_version": str(version)})

    def shutdown_weight_transfer_engine(self) -> None:
        self._post("shutdown_weight_transfer_engine")

    def world_size(self) -> int:
        r = httpx.get(f"{self.url}/get_world_size", timeout=self.timeout)
        r.raise_for_status()
        return int(r.json()["world_size"])


class VLLMWeightTransferSync(_Bound):
    """vLLM's native weight transfer: NCCL broadcast (`backend="nccl"`, trainer and engine on
    different GPUs) or CUDA IPC handles (`backend="ipc"`, same GPU).

    The engine must be launched with `--weight-transfer-config '{"backend": "<backend>"}'` and
    VLLM_SERVER_DEV_MODE=1 (plus VLLM_ALLOW_INSECURE_SERIALIZATION=1 for IPC). The trainer side
    is vLLM's own `WeightTransferTrainerFactory` engine (so `vllm` must be importable in the
    trainer's environment), driving the HTTP routes through `VLLMRoutes`: init once (first push),
    then per push start / update / finish, then `/update_weight_version`.

    pause: how in-flight requests live through the update: "keep" freezes them and resumes them
    on the new weights (their later tokens carry the new version), "wait" drains them first,
    "abort" drops them, None does not pause (requests see weights change between engine steps).

    UNTESTED here: NCCL and IPC need a GPU, and this project's CI machines have none. The route
    names, payloads and trainer-side classes are those of the vLLM 0.32 source; the CPU path
    (`DiskSync`) is the tested one.
    """

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        backend: Literal["nccl", "ipc"] = "nccl",
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        packed: bool = True,
        pause: Literal["keep", "wait", "abort"] | None = "keep",
        timeout: float = 600.0,
    ):
        if backend not in ("nccl", "ipc"):
            raise ValueError(f"module.weight_sync.backend={backend!r}: allowed 'nccl', 'ipc'")
        if pause not in ("keep", "wait", "abort", None):
            raise ValueError(f"module.weight_sync.pause={pause!r}: allowed 'keep', 'wait', 'abort', null")
        self.engine, self.backend, self.packed, self.timeout = engine, backend, packed, timeout
        self.pause = pause
        self.master_address, self.master_port = master_address, master_port
        self._transfer: Any = None  # vLLM's trainer-side transfer engine, made on the first push
        self._routes: VLLMRoutes | None = None

    def _init(self, model: nn.Module) -> None:
        try:
            from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
        except ImportError as e:
            raise RuntimeError(
                "VLLMWeightTransferSync needs vllm importable in the trainer environment; "
                "use DiskSync otherwise"
            ) from e
        self._routes = VLLMRoutes(self._engine().url, self.timeout)
        if self.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            from polar_pl.utils.serving import free_port

            info = NCCLTrainerInitInfo(
                master_address=self.master_address,
                master_port=self.master_port or free_port(self.master_address),
                world_size=1 + self._routes.world_size(),
                packed=self.packed,
                rank=0,
            )
        else:
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            info = IPCTrainerInitInfo(packed=self.packed, rank=0)
        self._transfer = WeightTransferTrainerFactory.trainer_init(
            info, client=self._routes, source=ModuleSource(model)
        )

    def push(self, model: nn.Module) -> int:
        from polar_pl.module.sharding import is_sharded

        if is_sharded(model):  # vLLM's trainer side reads whole parameters from the module
            raise ValueError(
                "module.weight_sync=vllm_nccl cannot push a sharded model (trainer.strategy=fsdp): "
                "use module/weight_sync=disk"
            )
        # checked before anything is sent: vLLM loads NaN weights without a word (engine/weights.py)
        check_tensors(dict(model.named_parameters()), None)
        if self._transfer is None:
            self._init(model)
        assert self._routes is not None  # set by _init
        if self.pause is not None:
            self._routes.pause(self.pause)
        self.pushed_bytes = nbytes(dict(model.named_parameters()))
        try:
            self._transfer.send_weights()  # start_weight_update, update_weights (+ broadcast), finish
            version = self.policy_version() + 1
            self._routes.update_weight_version(version)
            _set_engine_version(self._engine(), version)
        finally:
            if self.pause is not None:
                self._routes.resume()
        return version

    def follow(self, model: nn.Module) -> None:
        pass  # rank 0 refuses a sharded model before any gather

    def close(self) -> None:
        if self._transfer is not None:
            try:
                assert self._routes is not None  # set with _transfer by _init
                self._routes.shutdown_weight_transfer_engine()
            finally:
                self._transfer.shutdown()
                self._transfer = None


def _set_engine_version(engine: Engine, version: int) -> None:
    """Tell the engine handle its new version: vLLM answers carry none, so the gateway tags records
    with the handle's (`set_policy_version`, VLLMEngine's and PausingEngine's public hook)."""
    setter = getattr(engine, "set_policy_version", None)
    if callable(setter):
        setter(version)
    else:
        raise RuntimeError(f"{type(engine).__name__} cannot be told its policy version")
