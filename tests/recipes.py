"""The recipe a test runs. The base config's default is the real model's first run
(experiment=first_run); a test of the plumbing on the tiny model says experiment=tiny.

Imported as `from recipes import tiny` (tests/ is on sys.path through the root conftest).
"""

from __future__ import annotations


def tiny(*overrides: str) -> list[str]:
    """`overrides` with experiment=tiny added, unless they pick (or drop) a recipe themselves:
    Hydra refuses a key given twice. Added last: train.py's `-m` may come first."""
    named = any(o.split("=", 1)[0].lstrip("~+") == "experiment" for o in overrides)
    return list(overrides) if named else [*overrides, "experiment=tiny"]
