"""Start-up output a user cannot act on, silenced one message at a time, each with its reason.

Anything not listed here still prints: a new library warning is a real one until someone reads it
and adds it below with the reason it can be ignored.
"""

from __future__ import annotations

import logging
import warnings

#: (message regex, why it is safe to ignore)
IGNORED_WARNINGS: tuple[tuple[str, str], ...] = (
    (
        r"Using ModelCheckpoint with manual optimization",
        (
            "GRPO optimises manually on purpose, and a checkpoint is meant to hold the weights after "
            "the step (a resumed run continues with the next batch); Lightning suggests copying the "
            "weights before each step, which would be wrong here"
        ),
    ),
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        "raised inside Lightning's own pytree helper by torch 2.13; nothing in this project calls it",
    ),
    (
        r"You're resuming from a checkpoint that ended before the epoch ended",
        (
            "the run is one endless epoch by design; the datamodule restores its task cursor itself "
            "(state_dict), so the dataloader has nothing to resume"
        ),
    ),
)

#: Lightning's rank-zero info lines that advertise products or state the obvious on CPU.
DROPPED_INFO: tuple[str, ...] = ("💡 Tip:", "TPU available", "HPU available")


class _DropInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not any(msg.startswith(p) for p in DROPPED_INFO)


_filter = _DropInfo()


def quiet() -> None:
    """Install the filters (idempotent)."""
    for pattern, _why in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _filter not in rank_zero.filters:
        rank_zero.addFilter(_filter)
    # httpx logs every request at INFO: the datamodule's engine health checks (every 2 s while the
    # trainer waits for rollouts) and the weight pushes would fill train.log with them
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:  # transformers 5 draws a "Loading weights" bar for every 24-tensor tiny model it loads
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
