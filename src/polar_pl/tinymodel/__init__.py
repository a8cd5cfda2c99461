"""The tiny offline model: a Qwen3-architecture causal LM with a locally trained (or real Qwen)
byte-level BPE tokenizer and a Qwen3-style ChatML + tools template, built without network access.

Entry points: `polar_pl.tinymodel.build.build_tiny_model` and `polar-pl tiny-model`. The models
the learning checks start from, fine-tuned copies of this one, are built by polar_pl.warmstart.
"""
