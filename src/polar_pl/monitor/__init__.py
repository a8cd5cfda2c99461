"""What a run shows while it trains and leaves behind: per-step lines and time breakdown, the
rollout log, plots, and W&B media. Lightning callbacks, chosen in conf/callbacks/."""
