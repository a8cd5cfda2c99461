"""GRPO: pure advantage / loss math, the LightningModule, and weight push to the engine."""
