"""How `make test` spreads the suite over pytest-xdist workers (`-n 3`, Makefile).

Much of the suite's wall time is spent waiting (CLI harnesses and sandboxes starting, vLLM and
dockerd coming up, rollouts in flight), so three workers on two cores finish well before one.
Two rules keep that safe and short:

- Tests that share an expensive fixture run on one worker: an item's non-function-scoped fixtures
  defined in this repository (under pytest's rootdir, not in an installed package) are its shared keys (a session fixture
  by name, a module or package fixture by module), and items whose keys connect form one unit
  that a single worker runs. So one vLLM server per module, one Ray cluster, one `short_run`, one
  batch of reward-hacking scores: never started twice. Fixtures that only read what `make test`
  built (`PER_WORKER`) are not keys. (Docker is reached through `getfixturevalue` by
  backend-parametrized tests, which no static closure shows: each worker has its own dockerd.)
- Units (a group, or a lone test) go out longest first, by the durations measured in an earlier
  run (`durations.json`, refreshed with `pytest --store-durations`); a test it does not know
  counts as `UNKNOWN_S`. The 10-minute CLI learning checks then start at once instead of
  finishing last on one worker while the other idles.

Every process of the suite runs torch on one OpenMP thread (`pytest_configure`): the workers already
keep both cores busy, and threads beyond the cores only spin-wait.

`--fast` (`make check`, the lane to run before a commit) leaves out the tests marked `slow` and every
unit that took longer than `FAST_UNIT_S` in the run `durations.json` was measured on (a unit goes
whole: its tests share one expensive fixture).

The workers compute the plan (they hold the fixtures) and publish the unit of each test to a file
that the controller's scheduler reads: xdist's own `loadgroup` rewrites node ids, which pytest 9.2
no longer allows (the groups silently vanish), so `SharedFixtureScheduling` replaces it.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

DURATIONS = "tests/durations.json"  # below the rootdir
UNITS_ENV = "POLAR_XDIST_UNITS"  # the file where workers publish nodeid -> unit
UNKNOWN_S = 0.5
FAST_UNIT_S = 5.0
# Session fixtures that cost nothing per worker: paths to models and CLIs `make test` built, the
# per-process leftover check.
PER_WORKER = frozenset(
    {"tiny_model_dir", "multiturn_model_dir", "harness_prefix", "tool_case", "no_sandbox_leftovers"}
)


def shared_keys(item: pytest.Item, root: Path) -> set[str]:
    """The expensive fixtures `item` shares with other items: session ones by name, module and
    package ones by the module that instantiates them. Only fixtures defined under `root`."""
    keys = set()
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        fd = defs[-1]
        if fd.scope == "function" or name in PER_WORKER:
            continue
        try:
            source = inspect.getsourcefile(fd.func) or ""
        except TypeError:
            continue
        if not source.startswith(f"{root}{os.sep}") or "site-packages" in source:
            continue  # a plugin's (pytest-asyncio's session event loop): per worker by design
        keys.add(name if fd.scope == "session" else item.nodeid.split("::")[0])
    return keys


def groups(items: list[pytest.Item], root: Path) -> dict[str, str]:
    """nodeid -> group name, for items that share a key with anything (union-find over keys)."""
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    keys = {item.nodeid: sorted(shared_keys(item, root)) for item in items}
    for ks in keys.values():
        for k in ks:
            parent[find(k)] = find(ks[0])
    members: dict[str, list[str]] = {}
    for k in list(parent):
        members.setdefault(find(k), []).append(k)
    name = {root: min(ks) for root, ks in members.items()}  # stable: the component's smallest key
    return {nodeid: name[find(ks[0])] for nodeid, ks in keys.items() if ks}


def plan(
    items: list[pytest.Item], root: Path, fast: bool = False
) -> tuple[dict[str, str], list[pytest.Item]]:
    """Reorder `items` so units run longest first (order within a unit kept: pytest already
    ordered it for its fixtures); fast: without the units measured over `FAST_UNIT_S` or marked
    slow. Returns nodeid -> unit for every grouped item, and the items left out."""
    durations = root / DURATIONS
    seconds = json.loads(durations.read_text()) if durations.exists() else {}
    group_of = groups(items, root)
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(group_of.get(item.nodeid, item.nodeid), []).append(item)
    cost = {u: sum(seconds.get(i.nodeid, UNKNOWN_S) for i in members) for u, members in units.items()}
    out = []
    if fast:
        slow = {u for u, members in units.items()
                if cost[u] > FAST_UNIT_S or any(i.get_closest_marker("slow") for i in members)}  # fmt: skip
        out = [i for u in slow for i in units.pop(u)]
    items[:] = [i for u in sorted(units, key=lambda u: -cost[u]) for i in units[u]]
    return group_of, out


def publish(group_of: dict[str, str], path: Path) -> None:
    """Write the units for the controller (every worker writes the same; rename is atomic)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(group_of))
    tmp.replace(path)


class SharedFixtureScheduling(LoadScopeScheduling):
    """xdist's scope scheduling over our units: a unit's tests go to one worker together, units
    in the workers' collection order (longest first), the next unit to whichever worker is
    nearly done."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        config.option.loadscopereorder = False  # keep the planned order
        super().__init__(config, log)
        self._units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:  # called once all workers collected, i.e. published
            self._units = json.loads(Path(os.environ[UNITS_ENV]).read_text())
        return self._units.get(nodeid, nodeid)


def store(path: Path, reports: dict[str, float]) -> None:
    """Merge measured durations (setup + call + teardown, seconds) into `path`; keeps tests this
    run did not measure, drops sub-`UNKNOWN_S` ones (the default covers them)."""
    old = json.loads(path.read_text()) if path.exists() else {}
    merged = {k: v for k, v in {**old, **reports}.items() if v >= UNKNOWN_S}
    path.write_text(json.dumps({k: round(v, 1) for k, v in sorted(merged.items())}, indent=0) + "\n")


# -- the hooks (imported by tests/conftest.py) --


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations", action="store_true",
        help=f"merge this run's test durations into {DURATIONS} (xdist's longest-first order)",
    )  # fmt: skip
    parser.addoption(
        "--fast", action="store_true",
        help=f"the fast lane: leave out slow-marked tests and units measured over {FAST_UNIT_S:.0f} s",
    )  # fmt: skip


def pytest_configure(config):
    # One OpenMP thread per process (inherited by the engines, trainers and vLLM the tests start):
    # at torch's default of a thread per core, the workers' and their subprocesses' threads
    # oversubscribe the two cores and spin-wait on each other. The fast lane (-n 4) took 397 s
    # at the default and 196 s at one thread, with a third less CPU.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="polar-xdist-units-", suffix=".json")
        os.close(fd)
        os.environ[UNITS_ENV] = path  # the workers inherit it


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; absent with -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "each":
        return SharedFixtureScheduling(config, log)
    return None


@pytest.hookimpl(trylast=True)  # after pytest ordered the items for their fixtures, and -k / -m
def pytest_collection_modifyitems(config, items):
    worker, fast = hasattr(config, "workerinput"), config.getoption("fast")
    if not (worker or fast):
        return
    group_of, left_out = plan(items, config.rootpath, fast=fast)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
    if worker:  # an xdist worker
        publish(group_of, Path(os.environ[UNITS_ENV]))


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return
    if session.config.getoption("store_durations"):
        store(session.config.rootpath / DURATIONS, _durations)
    if os.environ.get(UNITS_ENV):
        Path(os.environ.pop(UNITS_ENV)).unlink(missing_ok=True)
