"""tests/scheduling.py: how `make test` splits the suite over xdist workers. On a suite made
here (pytester): tests sharing an expensive fixture form one unit, cheap and plugin fixtures
group nothing, units run longest first by the stored durations, and a real `-n 2` run keeps each
unit on one worker (xdist's own loadgroup lost its groups on pytest 9.2: the reason for this)."""

from __future__ import annotations

import json
import os

import pytest
import scheduling

pytest_plugins = ["pytester"]

CONFTEST = """
import os
import pytest
from scheduling import (pytest_addoption, pytest_collection_modifyitems, pytest_configure,
                        pytest_runtest_logreport, pytest_sessionfinish, pytest_xdist_make_scheduler)

def where(name):
    with open(os.environ["WHERE"], "a") as f:
        f.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")

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
"""
SUITE = {
    "test_a": """
from conftest import where
def test_uses_server(server): where("test_uses_server")
def test_plain(): where("test_plain")
def test_model_only(tiny_model_dir): where("test_model_only")
""",
    "test_b": """
from conftest import where
def test_registry(registry): where("test_registry")
def test_tok_one(tok): where("test_tok_one")
def test_tok_two(tok): where("test_tok_two")
""",
    "test_c": """
from conftest import where
def test_tok_here_too(tok): where("test_tok_here_too")
def test_slow(): where("test_slow")
def test_server_again(server): where("test_server_again")
""",
}


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = session\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**SUITE)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([os.path.dirname(scheduling.__file__), str(pytester.path)])
    )
    monkeypatch.setenv("WHERE", str(pytester.path / "where.txt"))
    return pytester


@pytest.fixture
def items(suite):
    collected, _ = suite.inline_genitems()
    return collected


def names(items, nodeids):
    return sorted(i.name for i in items if i.nodeid in nodeids)


def test_shared_fixtures_connect_into_units_and_cheap_ones_do_not(items, suite):
    got = scheduling.groups(items, suite.path)
    by_unit: dict[str, set[str]] = {}
    for nodeid, unit in got.items():
        by_unit.setdefault(unit, set()).add(nodeid)
    # registry needs server: one unit across two modules; a module fixture groups the users in its
    # module only (one instance per module anyway)
    assert sorted(names(items, u) for u in by_unit.values()) == [
        ["test_registry", "test_server_again", "test_uses_server"],
        ["test_tok_here_too"],
        ["test_tok_one", "test_tok_two"],
    ]
    # tiny_model_dir is read-only per worker (PER_WORKER); no fixture: no unit
    assert not {"test_plain", "test_model_only", "test_slow"} & set(names(items, got))


def test_fixtures_outside_the_rootdir_group_nothing(items, suite, tmp_path):
    """A plugin's session fixture (pytest-asyncio's event loop) is per worker by design."""
    assert scheduling.groups(items, tmp_path / "elsewhere") == {}


def test_units_run_longest_first_and_stay_whole(items, suite):
    slow = next(i.nodeid for i in items if i.name == "test_slow")
    (suite.path / "tests").mkdir()
    (suite.path / scheduling.DURATIONS).write_text(json.dumps({slow: 100.0}))
    units, left_out = scheduling.plan(items, suite.path)
    assert left_out == []
    order = [i.name for i in items]
    assert order[0] == "test_slow"
    first = min(order.index(n) for n in ("test_uses_server", "test_registry", "test_server_again"))
    assert sorted(order[first : first + 3]) == ["test_registry", "test_server_again", "test_uses_server"]
    unit = {i.name: units.get(i.nodeid) for i in items}
    assert unit["test_uses_server"] == unit["test_registry"] is not None and unit["test_plain"] is None


def test_the_fast_lane_leaves_out_whole_units_measured_slow(items, suite):
    """One test of the server's unit measured slow takes its unit out (they share the server);
    a lone test under the limit stays."""
    registry = next(i.nodeid for i in items if i.name == "test_registry")
    plain = next(i.nodeid for i in items if i.name == "test_plain")
    (suite.path / "tests").mkdir()
    (suite.path / scheduling.DURATIONS).write_text(json.dumps({registry: 60.0, plain: 1.0}))
    _, left_out = scheduling.plan(items, suite.path, fast=True)
    assert sorted(i.name for i in left_out) == ["test_registry", "test_server_again", "test_uses_server"]
    assert {"test_plain", "test_tok_one"} <= {i.name for i in items}


def test_two_workers_keep_each_unit_on_one_worker(suite):
    """xdist's default (load) scheduling deals the first tests out in chunks of two, the server's
    three tests to both workers: this fails without SharedFixtureScheduling."""
    result = suite.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
    worker = dict(line.split() for line in (suite.path / "where.txt").read_text().splitlines())
    assert set(worker.values()) == {"gw0", "gw1"}  # both worked
    assert worker["test_uses_server"] == worker["test_registry"] == worker["test_server_again"]
    assert worker["test_tok_one"] == worker["test_tok_two"]


def test_store_merges_and_drops_short_tests(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"a": 5.0, "b": 2.0}))
    scheduling.store(path, {"b": 3.0, "c": 0.1, "d": 7.04})
    assert json.loads(path.read_text()) == {"a": 5.0, "b": 3.0, "d": 7.0}
