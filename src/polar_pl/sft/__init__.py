"""Offline SFT data generation: rollouts with a fixed engine, a verification filter, and export as
a dataset (chat and token forms, stats, dataset card), resumable after an interruption.

    python -m polar_pl.sft harness=pi task=builtin engine=vllm sft.threshold=1.0
"""

from polar_pl.sft.run import SFTOptions, generate

__all__ = ["SFTOptions", "generate"]
