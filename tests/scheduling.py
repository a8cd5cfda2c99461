"""How `make test` spreads the suite over two pytest-xdist workers (`-n 2 --dist loadgroup`).

Most of the suite's wall time is spent waiting (CLI harnesses and sandboxes starting, vLLM and
dockerd coming up, rollouts in flight), so two workers on two cores finish well before one.
Two rules keep that safe and short:

- Tests that share an expensive fixture run on one worker: an item's non-function-scoped fixtures
  defined in this repository (tests/ or polar_pl.testing) are its shared keys (a session fixture
  by name, a module or package fixture by module), and items whose keys connect form one
  `xdist_group`. So one dockerd with its data root, one vLLM server per module, one Ray cluster,
  one `short_run`: never two of them racing for the same folder or started twice. Fixtures that
  only read what `make test` built (`PER_WORKER`) are not keys.
- Units (a group, or a lone test) go out longest first, by the durations measured in an earlier
  run (`durations.json`, refreshed with `pytest --store-durations`); a test it does not know
  counts as `UNKNOWN_S`. The 10-minute CLI learning checks then start at once instead of
  finishing last on one worker while the other idles.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

import polar_pl.testing

HERE = Path(__file__).resolve().parent
DURATIONS = HERE / "durations.json"
UNKNOWN_S = 0.5
# Session fixtures that cost nothing per worker: paths to models and CLIs `make test` built, the
# per-process leftover check.
PER_WORKER = frozenset({"tiny_model_dir", "multiturn_model_dir", "harness_prefix", "tool_case", "no_sandbox_leftovers"})
_OURS = (str(HERE), str(Path(polar_pl.testing.__file__).resolve().parent))


def shared_keys(item: pytest.Item, roots: tuple[str, ...] = _OURS) -> set[str]:
    """The expensive fixtures `item` shares with other items: session ones by name, module and
    package ones by the module that instantiates them. Only fixtures defined under `roots`."""
    keys = set()
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        fd = defs[-1]
        if fd.scope == "function" or name in PER_WORKER:
            continue
        try:
            source = inspect.getsourcefile(fd.func) or ""
        except TypeError:
            continue
        if not source.startswith(roots):
            continue  # a plugin's (pytest-asyncio's session event loop): per worker by design
        keys.add(name if fd.scope == "session" else item.nodeid.split("::")[0])
    return keys


def groups(items: list[pytest.Item], roots: tuple[str, ...] = _OURS) -> dict[str, str]:
    """nodeid -> group name, for items that share a key with anything (union-find over keys)."""
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    keys = {item.nodeid: sorted(shared_keys(item, roots)) for item in items}
    for ks in keys.values():
        for k in ks:
            parent[find(k)] = find(ks[0])
    members: dict[str, list[str]] = {}
    for k in list(parent):
        members.setdefault(find(k), []).append(k)
    name = {root: min(ks) for root, ks in members.items()}  # stable: the component's smallest key
    return {nodeid: name[find(ks[0])] for nodeid, ks in keys.items() if ks}


def plan(items: list[pytest.Item], durations: Path = DURATIONS, roots: tuple[str, ...] = _OURS) -> None:
    """Mark each shared group and reorder `items` so units run longest first (order within a
    unit kept: pytest already ordered it for its fixtures)."""
    seconds = json.loads(durations.read_text()) if durations.exists() else {}
    group_of = groups(items, roots)
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = group_of.get(item.nodeid)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
        units.setdefault(group or item.nodeid, []).append(item)
    cost = {u: sum(seconds.get(i.nodeid, UNKNOWN_S) for i in members) for u, members in units.items()}
    items[:] = [i for u in sorted(units, key=lambda u: -cost[u]) for i in units[u]]


def store(path: Path, reports: dict[str, float]) -> None:
    """Merge measured durations (setup + call + teardown, seconds) into `path`; keeps tests this
    run did not measure, drops sub-`UNKNOWN_S` ones (the default covers them)."""
    old = json.loads(path.read_text()) if path.exists() else {}
    merged = {k: v for k, v in {**old, **reports}.items() if v >= UNKNOWN_S}
    path.write_text(json.dumps({k: round(v, 1) for k, v in sorted(merged.items())}, indent=0) + "\n")
