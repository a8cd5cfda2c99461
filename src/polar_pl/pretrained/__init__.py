"""Real pretrained models built offline from files that ship on PyPI (smollm2.py)."""
