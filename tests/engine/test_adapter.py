"""The embedded engine's LoRA merge (engine/adapter.py) against PEFT's own: the merged weights
equal `merge_and_unload`'s, every push starts from the base, and an adapter it cannot apply is
refused before anything is written."""

from __future__ import annotations

import pytest
import torch

from polar_pl.engine.adapter import AdapterMerge, merge_plan
from polar_pl.gateway.call.capture import CallCapture
from polar_pl.module.lora import LoraSpec, adapter_state, attach
from polar_pl.module.model import load_model
from polar_pl.utils.adapters import adapter_model_name, adapter_version


def random_adapter(tiny_model_dir, seed: int, **spec):
    """A PEFT adapter on the tiny model with random A and B (PEFT starts B at 0: no effect)."""
    torch.manual_seed(seed)
    peft = attach(load_model(tiny_model_dir), LoraSpec(**{"rank": 4, "alpha": 8.0, **spec}))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.05)
    return peft


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_merge_equals_peft_and_each_push_starts_from_the_base(tiny_model_dir) -> None:
    engine_model = load_model(tiny_model_dir)
    base = weights(engine_model)
    merge = AdapterMerge(engine_model)
    first, second = (
        random_adapter(tiny_model_dir, 1),
        random_adapter(tiny_model_dir, 2, target_modules=("q_proj",)),
    )
    merge.apply(*adapter_state(first))
    want = weights(first.merge_and_unload())
    got = weights(engine_model)
    assert got.keys() == want.keys()
    assert max((got[k] - want[k]).abs().max().item() for k in got) < 1e-6
    # the second adapter targets q_proj only: every other layer the first one changed is back to base
    merge.apply(*adapter_state(second))
    want = weights(second.merge_and_unload())
    got = weights(engine_model)
    assert max((got[k] - want[k]).abs().max().item() for k in got) < 1e-6
    assert torch.equal(
        got["model.layers.0.mlp.down_proj.weight"], base["model.layers.0.mlp.down_proj.weight"]
    )


def test_rslora_scaling_matches_peft(tiny_model_dir) -> None:
    """An adapter trained elsewhere with rank-stabilised scaling (alpha / sqrt(r))."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    config = LoraConfig(r=4, lora_alpha=8, use_rslora=True, target_modules="all-linear")
    peft = get_peft_model(load_model(tiny_model_dir), config)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.05)
    engine_model = load_model(tiny_model_dir)
    AdapterMerge(engine_model).apply(*adapter_state(peft))
    want, got = weights(peft.merge_and_unload()), weights(engine_model)
    assert max((got[k] - want[k]).abs().max().item() for k in got) < 1e-6


def test_an_adapter_it_cannot_apply_is_refused_before_any_write(tiny_model_dir) -> None:
    engine_model = load_model(tiny_model_dir)
    base = weights(engine_model)
    merge = AdapterMerge(engine_model)
    tensors, config = adapter_state(random_adapter(tiny_model_dir, 4))
    for bad_config, message in (
        ({**config, "use_dora": True}, "use_dora"),
        ({**config, "peft_type": "IA3"}, "only LORA"),
    ):
        with pytest.raises(ValueError, match=message):
            merge.apply(tensors, bad_config)
    name = next(k for k in tensors if k.endswith("lora_B.weight"))
    # the last module's B has the wrong shape: the modules before it must not be written either
    wrong = {**tensors, name: torch.zeros(3, 2)}
    with pytest.raises(ValueError, match="does not fit"):
        merge.apply(wrong, config)
    only_a = {k: v for k, v in tensors.items() if k != name}
    with pytest.raises(ValueError, match="needs both lora_A and lora_B"):
        merge_plan(only_a, config)
    elsewhere = {k.replace("self_attn", "cross_attn"): v for k, v in tensors.items()}
    with pytest.raises(ValueError, match="which the model does not have"):
        merge.apply(elsewhere, config)
    assert all(torch.equal(v, base[k]) for k, v in weights(engine_model).items())


def test_the_adapter_name_carries_its_version() -> None:
    assert adapter_model_name("smollm2", 7) == "smollm2-lora-v7"
    assert adapter_version("smollm2-lora-v7") == 7 and adapter_version("smollm2-lora-v7", "other") is None
    assert adapter_version("smollm2") is None and adapter_version(None) is None
    # an engine that tags no version (vLLM) but answered from an adapter: its tokens get that version
    capture = CallCapture(policy_version=6)  # the gateway's hint: the version it last heard of
    capture.add({"id": "c", "model": "smollm2-lora-v7", "choices": [{"index": 0, "token_ids": [5, 9]}]})
    assert capture.policy_version == 7 and capture.token_versions == [7, 7]
