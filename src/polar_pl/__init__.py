"""polar_pl: reinforcement learning for LLM agents on the harnesses they actually run in."""

__version__ = "0.1.0"
