"""Stand-alone unittest runner copied into evaluation sandboxes (stdlib only, Python >= 3.8).

Usage: python3 -I unittest_runner.py IDS_JSON OUT_JSON PER_TEST_TIMEOUT_S

Runs each test id (`pkg.module.Class.method`) and writes {id: {"outcome", "detail"}} to OUT_JSON.
`-I` keeps the workspace off sys.path until the stdlib modules used here are imported, so a
`unittest.py` or `json.py` planted in the repository cannot replace the runner's machinery. A
per-test alarm turns a hanging test into a "timeout" outcome instead of losing every result.
"""

import json
import os
import signal
import sys
import traceback
import unittest


class _TestTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _TestTimeout("test exceeded its time limit")


class _Recorder(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes = {}

    def _set(self, test, outcome, detail=""):
        self.outcomes[test.id()] = {"outcome": outcome, "detail": detail[-4000:]}

    def addSuccess(self, test):
        self._set(test, "passed")

    def addFailure(self, test, err):
        self._set(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        outcome = "timeout" if err[0] is _TestTimeout else "error"
        self._set(test, outcome, self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        self._set(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        self._set(test, "passed")

    def addUnexpectedSuccess(self, test):
        self._set(test, "failed", "unexpected success")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            kind = "failed" if issubclass(err[0], test.failureException) else "error"
            self._set(test, kind, self._exc_info_to_string(err, test))


# The methods that decide an outcome. Code under test that replaces them (say, a package
# __init__ patching TestCase.run to report success) gets its tests marked as errors.
_GUARDED = [
    (cls, name)
    for cls, names in (
        (unittest.TestCase, ("run", "__call__", "debug")),
        (unittest.TestSuite, ("run",)),
        (unittest.suite.BaseTestSuite, ("run", "__call__")),
        (_Recorder, ("addSuccess", "addFailure", "addError", "addSkip", "addSubTest", "_set")),
    )
    for name in names
]
_ORIGINALS = {key: key[0].__dict__.get(key[1]) for key in _GUARDED}


def _tampered():
    """Undo and report replaced test machinery."""
    changed = []
    for (cls, name), original in _ORIGINALS.items():
        if cls.__dict__.get(name) is not original:
            changed.append(f"{cls.__name__}.{name}")
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
    return changed


def _run_one(test_id, timeout_s):
    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(test_id)
    except Exception:  # noqa: BLE001  (an import error in the code under test is that test's outcome)
        return {"outcome": "error", "detail": traceback.format_exc()[-4000:]}
    recorder = _Recorder()
    changed = _tampered()  # by importing the test module (and the code it imports)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(max(1, int(timeout_s)))
    try:
        if not changed:
            suite.run(recorder)
    except _TestTimeout:
        return {"outcome": "timeout", "detail": "test exceeded its time limit"}
    finally:
        signal.alarm(0)
    changed = changed or _tampered()  # ... or while running
    if changed:
        return {
            "outcome": "error",
            "detail": "the code under test modified the test machinery: " + ", ".join(changed),
        }
    if test_id in recorder.outcomes:
        return recorder.outcomes[test_id]
    if len(recorder.outcomes) == 1:  # e.g. a _FailedTest standing in for an import error
        return next(iter(recorder.outcomes.values()))
    if not recorder.outcomes:
        return {"outcome": "missing", "detail": "no test with this id was found"}
    # An id naming a class or module: it passes only if everything in it passes.
    bad = {k: v for k, v in recorder.outcomes.items() if v["outcome"] != "passed"}
    if not bad:
        return {"outcome": "passed", "detail": ""}
    first = next(iter(bad.values()))
    return {"outcome": first["outcome"], "detail": first["detail"]}


def main():
    ids_path, out_path, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(ids_path) as f:
        ids = json.load(f)
    sys.path.insert(0, os.getcwd())
    results = {}
    for test_id in ids:
        results[test_id] = _run_one(test_id, timeout_s)
        # Written after every test so that a hard crash still leaves the earlier outcomes.
        with open(out_path, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
