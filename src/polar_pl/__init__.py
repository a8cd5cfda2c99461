"""polar_pl: reinforcement learning for LLM agents on the harnesses they actually run in."""

__version__ = "0.1.0"

from polar_pl.utils.cpu import register_resolvers

# Here, not at each entry point: every way of composing the config (train.py, polar-pl eval / sft /
# warm-start, the rollout server, a test's initialize_config_dir) imports polar_pl first. The cost is
# omegaconf's import, ~0.14 s once per process, in the few that did not load it already.
register_resolvers()
