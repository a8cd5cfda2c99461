"""Connected components of an undirected graph (union-find)."""


def connected_components(nodes, edges):
    """Components as a sorted list of sorted lists."""
    parent = {n: n for n in nodes}

    def find(n):
        while parent[n] != n:
            n = parent[n]
        return n

    for a, b in edges:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        parent[a] = find(b)
    groups = {}
    for n in parent:
        groups.setdefault(find(n), []).append(n)
    return sorted(sorted(g) for g in groups.values())
