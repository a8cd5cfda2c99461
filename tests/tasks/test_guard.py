"""The in-sandbox guard's pieces, on the host (fast): attribution by call stack, fingerprints that
see a swapped `__code__` or a new class attribute, and the forged-equality probe that tells an
AlwaysEqual object from honest `__eq__` methods."""

from __future__ import annotations

import dataclasses
import fractions
import json
import subprocess
import sys
import unittest.mock
from pathlib import Path

import pytest

from polar_pl.tasks.inside import guard as guard_module
from polar_pl.tasks.inside.guard import Guard, fingerprint

CODE_UNDER_TEST = """
class AlwaysEqual:
    def __eq__(self, other):
        return True

class ListLover(list):
    def __eq__(self, other):
        return isinstance(other, list)

class Honest:
    def __init__(self, v):
        self.v = v
    def __eq__(self, other):
        return isinstance(other, Honest) and other.v == self.v

class Contains:
    def __contains__(self, item):
        return True

def frame_of_code_under_test(fn):
    return fn()
"""


@pytest.fixture
def guarded(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    guard = Guard(str(tmp_path), ["tests/test_x.py"])
    ns: dict = {}
    exec(compile(CODE_UNDER_TEST, str(tmp_path / "calc" / "mod.py"), "exec"), ns)
    trusted: dict = {}
    exec(compile("def call(fn):\n    return fn()\n", str(tmp_path / "tests" / "test_x.py"), "exec"), trusted)
    return guard, ns, trusted


def test_forged_equality_is_told_from_honest_equality(guarded):
    guard, ns, _ = guarded
    assert guard.forged_equality(ns["AlwaysEqual"](), [("num", 0.5)])
    assert guard.forged_equality([ns["AlwaysEqual"]()], [("num", 0.5)])  # nested in a container
    assert guard.forged_equality(ns["ListLover"](), [("num", 0.5)])  # yes to any list of the shape
    assert guard.forged_equality("x", ns["Contains"]())
    assert not guard.forged_equality(ns["Honest"](1), ns["Honest"](1))
    assert not guard.forged_equality([("num", 0.5)], [("num", 0.5)])

    @dataclasses.dataclass
    class Point:
        x: int

    # Comparison methods outside the code under test (stdlib, tests) are not probed at all.
    assert not guard.forged_equality(unittest.mock.ANY, 3)
    assert not guard.forged_equality(fractions.Fraction(1, 2), 0.5)
    assert not guard.forged_equality(Point(1), Point(1))
    assert len(guard.reasons) == 3 and "claims equality with anything" in guard.reasons[0]


def test_culprit_is_the_innermost_untrusted_frame(guarded):
    guard, ns, trusted = guarded
    here = sys._getframe
    guard.boundary.add(here().f_code)  # this test's frame plays the runner's outermost frame
    assert guard.culprit(here()) is None
    from_code = ns["frame_of_code_under_test"](lambda: here(1))
    assert guard.culprit(from_code) == "calc/mod.py"
    from_test = trusted["call"](lambda: here(1))
    assert guard.culprit(from_test) is None
    synthetic: dict = {}
    exec(compile("def f(g):\n    return g()\n", "<string>", "exec"), synthetic)
    assert guard.culprit(synthetic["f"](lambda: here(1))) == "<string>"


def test_fingerprints_see_swapped_code_and_new_class_attributes():
    module = type(sys)("polar_fake_mod")
    source = "class Case:\n    def run(self):\n        return 1\n\ndef helper(x=1):\n    return x\n"
    exec(source, module.__dict__)
    module.Case.__module__ = module.helper.__module__ = "polar_fake_mod"
    sys.modules["polar_fake_mod"] = module
    try:
        guard = Guard("/nonexistent", [])
        guard.protected_modules = lambda: [module]
        guard.snapshot()
        assert guard.changed() == []
        module.helper.__code__ = (lambda x=1: 2).__code__
        module.Case.__call__ = lambda self: None
        module.DATA = 5  # plain data and new module attributes are free to change
        assert sorted(guard.changed()) == ["polar_fake_mod:Case.__call__", "polar_fake_mod:helper"]
        assert "polar_fake_mod:helper" in fingerprint([module])
    finally:
        del sys.modules["polar_fake_mod"]


def test_audit_offences(guarded):
    guard, _, _ = guarded
    protected = str(guard.workspace) + "tests/test_x.py"
    assert guard._offence("ctypes.dlopen", ("libc.so.6",)) == "ctypes.dlopen"
    assert guard._offence("open", (protected, "w", 0)).startswith("writing")
    assert guard._offence("open", (protected, "r", 0)) is None
    assert guard._offence("object.__setattr__", (object(), "__code__", None)) == "assigning __code__"
    assert guard._offence("os.kill", (guard.parent, 9)) is not None
    assert guard._offence("os.kill", (12345678, 0)) is None
    assert guard._offence("compile", (b"", guard_module.__file__)) is None  # the host's own file


THREADS = """
import _thread, json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from guard import Guard, THREAD_EXIT_GRACE_S
guard = Guard(sys.argv[2], [])
done, stop = threading.Event(), threading.Event()
_thread.start_new_thread(lambda: (done.set(), time.sleep(0.2)), ())  # a native thread ending soon
done.wait()
ending = guard.threads_left()
_thread.start_new_thread(stop.wait, ())  # one that keeps running
t0 = time.monotonic()
running = guard.threads_left()
print(json.dumps([ending, running, time.monotonic() - t0 >= THREAD_EXIT_GRACE_S]))
"""


def test_a_thread_still_exiting_is_waited_for_and_one_still_running_is_reported(tmp_path):
    """After `join()` the OS thread lives on for a moment (its Python state gone, its pthread not
    yet): on a loaded machine the native count still sees it. It is waited for, not reported; one
    that keeps running is. In a fresh interpreter, as the runner is (a test worker has threads)."""
    kit = Path(guard_module.__file__).parent
    out = subprocess.run([sys.executable, "-I", "-c", THREADS, str(kit), str(tmp_path)],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert json.loads(out.stdout) == [[], ["native"], True]
