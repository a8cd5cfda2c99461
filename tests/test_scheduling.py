"""tests/scheduling.py: how `make test` splits the suite over two xdist workers. On a suite made
here (pytester), tests sharing an expensive fixture form one group, cheap and plugin fixtures
group nothing, and units run longest first by the stored durations."""

from __future__ import annotations

import json

import pytest
import scheduling

pytest_plugins = ["pytester"]

SUITE = {
    "conftest.py": """
import pytest

@pytest.fixture(scope="session")
def server():
    yield "up"

@pytest.fixture(scope="session")
def registry(server):
    yield "reg"

@pytest.fixture(scope="session")
def tiny_model_dir():
    return "model"

@pytest.fixture(scope="module")
def tok():
    return "tok"
""",
    "test_a.py": """
def test_uses_server(server): pass
def test_plain(): pass
def test_model_only(tiny_model_dir): pass
""",
    "test_b.py": """
def test_registry(registry): pass
def test_tok_one(tok): pass
def test_tok_two(tok): pass
""",
    "test_c.py": """
def test_tok_here_too(tok): pass
def test_slow(): pass
""",
}


@pytest.fixture
def items(pytester):
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = session\n")
    pytester.makepyfile(**{name.removesuffix(".py"): text for name, text in SUITE.items()})
    collected, _ = pytester.inline_genitems()
    return collected


def names(items, nodeids):
    return sorted(i.name for i in items if i.nodeid in nodeids)


def test_shared_fixtures_connect_into_groups_and_cheap_ones_do_not(items, pytester):
    got = scheduling.groups(items, roots=(str(pytester.path),))
    by_group: dict[str, set[str]] = {}
    for nodeid, group in got.items():
        by_group.setdefault(group, set()).add(nodeid)
    # registry needs server: one group across two modules; a module fixture groups the users in
    # its module only (one instance per module anyway)
    assert sorted(names(items, g) for g in by_group.values()) == [
        ["test_registry", "test_uses_server"],
        ["test_tok_here_too"],
        ["test_tok_one", "test_tok_two"],
    ]
    # tiny_model_dir is read-only per worker (PER_WORKER); no fixture: no group
    assert not {"test_plain", "test_model_only", "test_slow"} & set(names(items, got))


def test_fixtures_outside_the_roots_group_nothing(items, pytester):
    """A plugin's session fixture (pytest-asyncio's event loop) is per worker by design."""
    assert scheduling.groups(items, roots=("/nowhere",)) == {}


def test_units_run_longest_first_and_stay_whole(items, pytester, tmp_path):
    durations = tmp_path / "durations.json"
    slow = next(i.nodeid for i in items if i.name == "test_slow")
    durations.write_text(json.dumps({slow: 100.0}))
    scheduling.plan(items, durations, roots=(str(pytester.path),))
    order = [i.name for i in items]
    assert order[0] == "test_slow"
    group = ["test_uses_server", "test_registry"]
    start = order.index(group[0])
    assert order[start : start + 2] == group  # one unit: contiguous, in collection order
    marks = {i.name: [m.args[0] for m in i.iter_markers("xdist_group")] for i in items}
    assert len({marks[n][0] for n in group}) == 1 and marks["test_plain"] == []


def test_store_merges_and_drops_short_tests(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"a": 5.0, "b": 2.0}))
    scheduling.store(path, {"b": 3.0, "c": 0.1, "d": 7.04})
    assert json.loads(path.read_text()) == {"a": 5.0, "b": 3.0, "d": 7.0}
