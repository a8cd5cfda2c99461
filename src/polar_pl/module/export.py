"""The trained policy as a plain Hugging Face folder that transformers, vLLM and `polar-pl engine`
load: weights (safetensors) and config from the model, tokenizer, chat template and generation
config from the folder it was trained from. Also what turns a training checkpoint into such a
folder (`polar-pl eval eval.ckpt_path=...`)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import lightning as L
import torch
from torch import nn

log = logging.getLogger("polar_pl.train")

# What a model folder holds besides the weights and config.json: copied from the starting folder.
_KEEP = ("tokenizer*", "chat_template*", "special_tokens_map.json", "vocab*", "merges.txt",
         "generation_config.json", "polar_model.json", "tinymodel.json")  # fmt: skip


def export_hf(model: nn.Module, model_dir: str | Path, out: str | Path) -> Path:
    """Write `model` with the tokenizer files of `model_dir` into `out` (replaced); returns it."""
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    for pattern in _KEEP:
        for src in Path(model_dir).glob(pattern):
            if src.is_file() and not (out / src.name).exists():
                shutil.copy(src, out / src.name)
    return out


def hf_from_checkpoint(ckpt_path: str | Path, model_dir: str | Path, out: str | Path) -> Path:
    """A Lightning checkpoint of `GRPOModule` (trained from `model_dir`) as an HF folder at `out`."""
    from polar_pl.module.model import load_model

    state = torch.load(str(ckpt_path), map_location="cpu", weights_only=False)["state_dict"]
    weights = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    if not weights:
        raise ValueError(f"{ckpt_path}: no model.* weights in the checkpoint's state_dict")
    model = load_model(model_dir)
    model.load_state_dict(weights, strict=True)
    return export_hf(model, model_dir, out)


class ExportModel(L.Callback):
    """At the end of a run that was not interrupted: the final policy into `out_dir` (`<run>/model`)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm = getattr(trainer, "datamodule", None)
        if trainer.global_rank != 0 or getattr(dm, "interrupted", False):
            return
        path = export_hf(pl_module.model, pl_module.model_dir, self.out_dir)
        log.info("model: %s (transformers, vLLM and `polar-pl engine --model %s` load it)", path, path)
