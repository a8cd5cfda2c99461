"""Why a run stops before its end, in one line: `train.py` prints `str(exc)` of these as the run's
last line and exits 1, instead of a traceback that hides the reason under Hydra's frames.

`ConfigError`: a setting that cannot work, found at start-up, before the engine starts; the
message names the key and how to fix it. `RunFailed`: the run started but cannot go on (every
rollout fails the same way, the engine stopped answering); the message is the reason.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot work: one line naming the key and the fix."""


class RunFailed(RuntimeError):
    """A started run that cannot go on: one line saying why."""
