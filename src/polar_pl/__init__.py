"""polar_pl: reinforcement learning for LLM agents on the harnesses they actually run in."""

__version__ = "0.1.0"

from polar_pl.utils.cpu import register_resolvers

register_resolvers()  # every entry point composes its config after importing polar_pl
