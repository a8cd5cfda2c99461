"""Dependency ordering."""


class CycleError(ValueError):
    """The dependencies contain a cycle; `.cycle` lists its nodes."""

    def __init__(self, cycle):
        super().__init__("dependency cycle: " + " -> ".join(map(str, cycle)))
        self.cycle = cycle


def toposort(deps):
    """deps maps node -> set of nodes it depends on. Returns a list in which every node comes after
    all of its dependencies; ties are broken by sorting, so the result is deterministic."""
    remaining = {node: set(d) for node, d in deps.items()}
    order = []
    while remaining:
        ready = sorted(n for n, d in remaining.items() if not d)
        if not ready:
            raise CycleError(_find_cycle(remaining))
        for node in ready:
            del remaining[node]
        for d in remaining.values():
            d.difference_update(ready)
        order.extend(ready)
    return order


def _find_cycle(remaining):
    node = min(remaining)
    seen = []
    while node not in seen:
        seen.append(node)
        node = min(remaining[node])
    return seen[seen.index(node) :] + [node]
