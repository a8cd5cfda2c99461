"""bf16 only where the CPU computes it natively: the real-model experiments resolve their precision
by the CPU they run on (an AVX2-only CPU emulates bf16 ~30x slower: bench/bf16_cpu.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from polar_pl.utils import cpu
from polar_pl.warmstart.cli import compose_config


@pytest.mark.parametrize("native", [True, False])
def test_real_model_experiments_pick_bf16_only_where_it_is_native(native, monkeypatch):
    monkeypatch.setattr(cpu, "bf16_is_native", lambda: native)
    for experiment in ("smollm2_arith", "smollm2_tools"):
        cfg = compose_config([f"experiment={experiment}"])
        assert cfg.trainer.precision == ("bf16-mixed" if native else "32-true"), experiment
    assert compose_config(["experiment=smollm2_tools"]).warm_start.tools.bf16 is native
    # an explicit choice is kept either way
    assert (
        compose_config(["experiment=smollm2_arith", "trainer.precision=bf16-mixed"]).trainer.precision
        == "bf16-mixed"
    )


def test_the_probe_reads_torch_and_the_resolver_is_registered_on_import():
    import torch

    assert cpu.bf16_is_native() == (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )
    assert OmegaConf.create({"p": "${cpu_bf16:a,b}"}).p in ("a", "b")
