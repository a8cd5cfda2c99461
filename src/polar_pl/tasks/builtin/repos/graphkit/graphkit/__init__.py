"""graphkit: graph algorithms on plain dicts."""

from graphkit.components import connected_components
from graphkit.paths import shortest_path
from graphkit.toposort import CycleError, toposort

__all__ = ["CycleError", "connected_components", "shortest_path", "toposort"]
