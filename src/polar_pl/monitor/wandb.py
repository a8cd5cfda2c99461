"""Lightning's WandbLogger without the `anonymous=None` it always passes to `wandb.init` (wandb 0.31
warns that the setting has no effect on every run, and nothing in the config can stop it)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import WandbLogger as _WandbLogger


class WandbLogger(_WandbLogger):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)
