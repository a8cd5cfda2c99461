"""StopWhenSolved (src/polar_pl/solved.py) in a real Lightning fit: the loop stops after `patience`
steps in a row whose pass rate is 1.0, and a step below 1.0 restarts the count."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from polar_pl.solved import StopWhenSolved


class PassRates(L.LightningModule):
    """Logs one given rollout/pass_rate per training step, as the GRPO module logs the batch's."""

    def __init__(self, rates: list[float]) -> None:
        super().__init__()
        self.rates = rates
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.log("rollout/pass_rate", self.rates[batch_idx], on_step=True, batch_size=1)
        self.steps += 1
        return (self.w * batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(len(self.rates), 1), batch_size=None)


def fit(rates: list[float], patience: int | None) -> int:
    module = PassRates(rates)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StopWhenSolved(patience)])  # fmt: skip
    trainer.fit(module)
    return module.steps


def test_the_run_stops_after_patience_solved_steps_in_a_row():
    rates = [0.0, 0.5, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert fit(rates, patience=3) == 8  # the streak at steps 3-4 broke at step 5; 6-8 ended it
    assert fit(rates, patience=4) == 10  # never 4 in a row: every step runs
    assert fit(rates, patience=None) == 10


def test_a_patience_below_one_names_its_key():
    with pytest.raises(ValueError, match="callbacks.stop_when_solved.patience"):
        StopWhenSolved(0)
