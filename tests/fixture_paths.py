"""Where the tests find what lies outside src/: the one place that knows the checkout's layout.

Imported as `from fixture_paths import CAPTURES` (tests/ is on sys.path through the root conftest).
"""

from __future__ import annotations

import os
from pathlib import Path

import polar_pl

REPO = Path(__file__).resolve().parents[1]
# The design notes and recorded fixtures sit beside the checkout (../shared).
SHARED = REPO.parent / "shared"
CAPTURES = SHARED / "fixtures" / "harness-captures"
# The Hydra configs, as the package ships them (the checkout's conf/ links here).
CONF = Path(polar_pl.__file__).resolve().parent / "conf"
HARNESS_PREFIX = Path(os.environ.get("POLAR_HARNESS_PREFIX", REPO / ".cache" / "harness"))
TINY_MODEL = Path(os.environ.get("POLAR_TINY_MODEL", REPO / ".cache" / "tiny-model"))
# The tiny model warm-started on the case task's note-taking sessions (`make test` builds it).
MULTITURN_MODEL = TINY_MODEL.parent / "tiny-model-multiturn"
# SmolLM2-135M-Instruct's HF folder (`make real-model`; the fixture builds it when missing).
REAL_MODEL = TINY_MODEL.parent / "smollm2-135m-instruct"
