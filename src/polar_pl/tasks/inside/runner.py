"""The test child: runs the tests of one file and reports to the supervisor (stdlib only).

Started by supervisor.py as `python3 -I -B -c BOOT RFD WFD`; its code arrives on RFD (nothing of it
is read from the workspace), then a ticket the supervisor made for this child only. Order:

1. read the kit and the ticket; import everything the runner needs; become non-dumpable;
2. install the guard (guard.py): audit hook, hardened unittest assertions, fingerprints;
3. only then put the workspace on sys.path and import the tests (the task's own files, served from
   the verified bytes in the kit) and through them the code under test; run each test; after each,
   check the guard; timeouts by SIGALRM;
4. send `ready` with the ticket; receive the nonce; send the results with ticket and nonce; `os._exit`
   (so no atexit hook, finalizer or buffered write of the code under test runs after the report).

The code under test learns the nonce only if it is still running after the checks, and anything it
writes to the channel before `ready` is a protocol violation the supervisor reports.
"""

import importlib.abc
import importlib.util
import json
import marshal
import os
import signal
import sys
import traceback
import types
import unittest
import unittest.case

import polar_guard

BUNDLE_PREFIX = "<polar-bundle>/"
_ASSERTS = (
    "assertEqual",
    "assertAlmostEqual",
    "assertIn",
    "assertCountEqual",
    "assertListEqual",
    "assertTupleEqual",
    "assertDictEqual",
    "assertSetEqual",
    "assertSequenceEqual",
    "assertMultiLineEqual",
    "assertGreater",
    "assertGreaterEqual",
    "assertLess",
    "assertLessEqual",
)


class TestTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise TestTimeout("test exceeded its time limit")


def make_undumpable():
    """PR_SET_DUMPABLE 0: no other process of this uid may ptrace us or read /proc/<pid>/mem;
    PR_SET_PDEATHSIG: we die with the supervisor (a timeout kills it, not our session).

    ctypes is dropped from sys.modules afterwards: its import runs `dlopen` (an audited event,
    blocked for the code under test), while calls such as ctypes.memmove are not audited at all,
    so a ctypes the code under test finds already imported would let it rewrite memory unseen."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)
        return libc.prctl(4, 0, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):  # no libffi, or no prctl
        return False
    finally:
        for name in [n for n in sys.modules if n in ("ctypes", "_ctypes") or n.startswith("ctypes.")]:
            del sys.modules[name]


class VerifiedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves modules from bytes held in memory: the task's test files (checked by the
    supervisor) and the pytest bundle. Nothing a later process writes to disk changes them."""

    def __init__(self, files, prefix):
        self.files, self.prefix = files, prefix

    def find_spec(self, name, path=None, target=None):
        base = name.replace(".", "/")
        for rel, is_pkg in ((base + "/__init__.py", True), (base + ".py", False)):
            if rel in self.files:
                spec = importlib.util.spec_from_loader(
                    name, self, origin=self.prefix + rel, is_package=is_pkg
                )
                assert spec is not None  # a loader is given: never None
                spec.has_location = True
                if is_pkg:
                    spec.submodule_search_locations = [self.prefix + base]
                return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        origin = module.__spec__.origin
        module.__file__ = origin
        rel = origin[len(self.prefix) :]
        code = self.files.code(rel) if isinstance(self.files, ZipFiles) else None
        if code is None:
            code = compile(self.files[rel], origin, "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, name):
        base = name.replace(".", "/")
        data = self.files.get(base + ".py", self.files.get(base + "/__init__.py"))
        return data.decode() if data is not None else None


class ZipFiles:
    """The bundle's files by name, decompressed on first use (a test process imports a fraction),
    and their compiled code where it was compiled for this interpreter (pytest_bundle.py)."""

    def __init__(self, data):
        import io
        import zipfile

        self.zip = zipfile.ZipFile(io.BytesIO(data))
        listed = self.zip.namelist()
        self.names = frozenset(n for n in listed if n.endswith(".py"))
        self.compiled = frozenset(n for n in listed if n.endswith(".pyc"))

    def code(self, name):
        if name + "c" not in self.compiled:
            return None
        data = self.zip.read(name + "c")
        if data[:4] != importlib.util.MAGIC_NUMBER:
            return None
        return marshal.loads(data[4:])

    def __contains__(self, name):
        return name in self.names

    def __getitem__(self, name):
        return self.zip.read(name)

    def get(self, name, default=None):
        return self[name] if name in self.names else default


def harden_unittest(guard):
    """Assertions that also refuse forged equality; SkipTest raised by code under test is flagged."""
    for name in _ASSERTS:
        original = unittest.case.TestCase.__dict__[name]

        def checked(self, first, second, *args, __original=original, **kwargs):
            result = __original(self, first, second, *args, **kwargs)
            if guard.forged_equality(first, second):
                raise self.failureException("polar evaluation guard: forged equality")
            return result

        checked.__name__ = checked.__qualname__ = name
        setattr(unittest.case.TestCase, name, checked)
    skip_init = unittest.case.SkipTest.__init__

    def skip_test_init(self, *args):
        who = guard.culprit(sys._getframe(1))
        if guard.armed and who is not None:
            guard.flag(f"test skipped from the code under test ({who})")
        skip_init(self, *args)

    unittest.case.SkipTest.__init__ = skip_test_init  # type: ignore[method-assign]


# -- unittest ------------------------------------------------------------------------------------
class Recorder(unittest.TestResult):
    """Outcomes as unittest reports them. A report made from the code under test (say, a finalizer
    calling addSuccess after the failure was recorded) or a second report for a test is tampering."""

    def __init__(self, guard):
        super().__init__()
        self.guard = guard
        self.outcomes = {}

    def _set(self, test, outcome, detail=""):
        who = self.guard.culprit(sys._getframe(2))
        if who is not None:
            self.guard.flag(f"a test outcome was reported from the code under test ({who})")
        test_id = test.id()
        if test_id in self.outcomes and not (
            outcome == "passed" and self.outcomes[test_id]["outcome"] == "xfail"
        ):
            self.guard.flag(f"a second outcome was reported for {test_id}")
            return
        self.outcomes[test_id] = {"outcome": outcome, "detail": detail[-4000:]}

    def addSuccess(self, test):
        self._set(test, "passed")

    def addFailure(self, test, err):
        self._set(test, "failed", self._exc_info_to_string(err, test))  # type: ignore[attr-defined]

    def addError(self, test, err):
        self._set(test, "timeout" if err[0] is TestTimeout else "error", self._exc_info_to_string(err, test))  # type: ignore[attr-defined]

    def addSkip(self, test, reason):
        self._set(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        self._set(test, "xfail")

    def addUnexpectedSuccess(self, test):
        self._set(test, "failed", "unexpected success")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            kind = "failed" if issubclass(err[0], test.failureException) else "error"
            self._set(test, kind, self._exc_info_to_string(err, test))  # type: ignore[attr-defined]


def run_unittest_id(test_id, timeout_s, guard):
    recorder = Recorder(guard)
    signal.alarm(max(1, int(timeout_s)))
    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(test_id)
        suite.run(recorder)
    except TestTimeout:
        return {"outcome": "timeout", "detail": "test exceeded its time limit"}
    except BaseException:
        return {"outcome": "error", "detail": traceback.format_exc()[-4000:]}
    finally:
        signal.alarm(0)
    got = recorder.outcomes
    if test_id in got:
        return got[test_id]
    if len(got) == 1:  # a _FailedTest standing in for an import error
        return next(iter(got.values()))
    if not got:
        return {"outcome": "missing", "detail": "no test with this id was found"}
    bad = [v for v in got.values() if v["outcome"] not in ("passed", "xfail")]
    return bad[0] if bad else {"outcome": "passed", "detail": ""}  # an id naming a class or module


def run_unittest(kit, guard, results):
    for test_id in kit["ids"]:
        results[test_id] = run_unittest_id(test_id, kit["timeout"], guard)
        threads = guard.threads_left()  # waits for exiting ones, so check() sees what they did
        tampered = guard.check()
        if threads:
            return f"threads still running after {test_id}: {', '.join(threads[:3])}"
        if tampered:
            results[test_id] = {"outcome": "error", "detail": "; ".join(tampered)}
    return None


# -- pytest --------------------------------------------------------------------------------------
def load_pytest(kit, workspace):
    """The image's pytest when it has one (outside the workspace), else the bundle from the kit."""
    found = importlib.util.find_spec("pytest")
    own = (
        found is not None
        and found.origin
        and not os.path.realpath(found.origin).startswith(workspace + os.sep)
    )
    if not own and kit.get("bundle"):
        sys.meta_path.insert(0, VerifiedFinder(ZipFiles(kit["bundle"]), BUNDLE_PREFIX))
    import _pytest
    import pluggy
    import pytest

    plugin = types.ModuleType("polar_pytest_plugin")
    plugin.__file__ = "<polar>/pytest_plugin.py"
    sys.modules[plugin.__name__] = plugin
    exec(compile(kit["sources"]["polar_pytest_plugin"], plugin.__file__, "exec"), plugin.__dict__)
    return pytest, plugin, [os.path.dirname(str(m.__file__)) for m in (_pytest, pluggy, pytest)]


def run_pytest(kit, guard, results, pytest, plugin_module):
    plugin = plugin_module.Plugin(guard, kit, results, TestTimeout)
    args = [*kit["ids"], *kit["pytest_args"]]
    try:
        code = pytest.main(args, plugins=[plugin, plugin_module.ConftestCheck(guard)])
    except BaseException:
        return "pytest crashed: " + traceback.format_exc()[-2000:]
    return plugin.fatal or (None if int(code) in (0, 1) else f"pytest exited with status {int(code)}")


# -- protocol ------------------------------------------------------------------------------------
def _read_line(fd):
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            os._exit(3)
        buf += chunk
    return buf.decode().strip()


def _send(fd, obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def main(kit, rfd, wfd):
    ticket = _read_line(rfd)
    os.set_inheritable(rfd, False)
    os.set_inheritable(wfd, False)
    undumpable = make_undumpable()
    workspace = os.getcwd()
    trusted = kit["trusted"]
    guard = polar_guard.Guard(workspace, trusted)
    guard.boundary.add(sys._getframe().f_code)
    guard.install()
    harden_unittest(guard)
    signal.signal(signal.SIGALRM, _on_alarm)
    results: dict[str, dict] = {}
    fatal = None
    if kit["mode"] == "pytest":
        pytest, plugin_module, dirs = load_pytest(kit, workspace)
        guard.add_framework(dirs)
    else:
        sources = {p: trusted[p] for p in trusted if p.endswith(".py")}
        sys.meta_path.insert(0, VerifiedFinder(sources, workspace + os.sep))
    sys.path.insert(0, workspace)
    sys.dont_write_bytecode = True
    if kit["mode"] != "pytest":  # pytest's plugin takes its first snapshot before the conftests
        guard.snapshot()
    guard.armed = True
    if kit["mode"] == "pytest":
        fatal = run_pytest(kit, guard, results, pytest, plugin_module)
    else:
        fatal = run_unittest(kit, guard, results)
        guard.check()
    guard.armed = False
    _send(wfd, {"ready": ticket})
    nonce = _read_line(rfd)
    _send(
        wfd,
        {
            "ticket": ticket,
            "nonce": nonce,
            "results": results,
            "fatal": fatal,
            "tampering": guard.reasons,
            "undumpable": undumpable,
        },
    )
    os._exit(0)
