"""Shortest paths with non-negative edge weights (Dijkstra)."""

import heapq


def shortest_path(graph, source, target):
    """graph maps node -> {neighbour: weight}. Returns (cost, [source, ..., target]) or None when
    target is unreachable."""
    queue = [(0, source, [source])]
    done = set()
    while queue:
        cost, node, path = heapq.heappop(queue)
        if node == target:
            return cost, path
        for nxt, weight in graph.get(node, {}).items():
            if nxt in done:
                continue
            done.add(nxt)
            heapq.heappush(queue, (cost + weight, nxt, path + [nxt]))
    return None
