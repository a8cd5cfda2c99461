"""The runner's pytest plugin (loaded into the test child only after pytest is imported).

Outcomes are taken from pytest's own reports (setup / call / teardown, as its `-rA` summary reads
them), never from the terminal output. After each test the guard's checks run; a skip or xfail
raised from the code under test, a conftest.py or test file that is not the task's, and passing
comparisons with forged equality (seen through pytest's assertion-pass hook) are tampering.
"""

import hashlib
import os
import sys

import pytest

# What pytest itself changes while it configures (after the conftests are loaded, before the
# session): its own modules (legacypath, cacheprovider patch its classes) and these hooks ...
SESSION_SETUP = frozenset(
    (
        "threading:excepthook",
        "warnings:_showwarnmsg_impl",
        "warnings:showwarning",
        "sys:unraisablehook",
        "sys:meta_path[]",
    )
)
PYTEST_MODULES = ("_pytest", "pytest", "pluggy")
# ... and what it rebinds for every test.
PER_TEST = frozenset(
    (
        "_pytest.assertion.util:_reprcompare",
        "_pytest.assertion.util:_assertion_pass",
        "_pytest.assertion.util:_config",
    )
)


class Plugin:
    def __init__(self, guard, kit, results, timeout_exc):
        self.guard = guard
        self.results = results
        self.timeout_s = kit["timeout"]
        self.timeout_exc = timeout_exc
        self.trusted_sha = kit["trusted_sha"]
        self.workspace = os.getcwd()
        self.timed_out = set()
        self.checked = set()
        self.fatal = None

    # -- files the run loads -------------------------------------------------------------------
    def _verify(self, path, what):
        rel = os.path.relpath(os.path.realpath(str(path)), self.workspace)
        if rel in self.checked:
            return
        self.checked.add(rel)
        want = self.trusted_sha.get(rel)
        if want is None:
            self.guard.flag(f"{what} {rel} is not one of the task's files")
            return
        with open(os.path.join(self.workspace, rel), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != want:
                self.guard.flag(f"{what} {rel} differs from the task's copy")

    def pytest_plugin_registered(self, plugin):
        path = getattr(plugin, "__file__", None) or ""
        if os.path.basename(path) == "conftest.py":
            self._verify(path, "conftest")

    def pytest_itemcollected(self, item):
        self._verify(getattr(item, "path", None) or item.fspath, "test file")

    # -- per test --------------------------------------------------------------------------------
    def pytest_load_initial_conftests(self, early_config, parser, args):
        """Runs after pytest's own tryfirst implementations (legacypath patches Config here) and
        before the trylast one that imports the conftests: the reference for checking them. (No
        code under test has run before this point: plugin autoload is off.)"""
        self.guard.snapshot()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session):
        """pytest has configured itself (changing its own modules, which the conftest check above
        did not see changed): from here its state is the reference for every test."""
        own = [k for k in self.guard.changed(SESSION_SETUP) if not k.startswith(PYTEST_MODULES)]
        if own:
            self.guard.flag("test machinery replaced while pytest configured: " + ", ".join(own[:5]))
        self.guard.snapshot()

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: the others have cleaned up
    def pytest_runtest_protocol(self, item, nextitem):
        yield
        threads = self.guard.threads_left()  # waits for exiting ones, so check() sees what they did
        tampered = self.guard.check(ignore=PER_TEST)
        if tampered:
            self.results[item.nodeid] = {"outcome": "error", "detail": "; ".join(tampered)}
        if threads:
            self.fatal = f"threads still running after {item.nodeid}: {', '.join(threads[:3])}"
            item.session.shouldstop = self.fatal

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        import signal

        signal.alarm(max(1, int(self.timeout_s)))
        try:
            yield
        finally:
            signal.alarm(0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        yield
        excinfo = call.excinfo
        if excinfo is None:
            return
        if excinfo.errisinstance(self.timeout_exc):
            self.timed_out.add(item.nodeid)
        if excinfo.errisinstance((pytest.skip.Exception, pytest.xfail.Exception)):
            tb = excinfo.tb
            while tb.tb_next is not None:
                tb = tb.tb_next
            who = self.guard.culprit(tb.tb_frame)
            if who is not None:
                self.guard.flag(f"{excinfo.typename} raised from the code under test ({who})")

    def pytest_runtest_logreport(self, report):
        who = self.guard.culprit(sys._getframe(1))
        if who is not None:
            self.guard.flag(f"a test report was made from the code under test ({who})")
        outcome = _outcome(report)
        if outcome is None:
            return
        if report.nodeid in self.timed_out and outcome == "failed":
            outcome = "timeout"
        previous = self.results.get(report.nodeid, {}).get("outcome")
        if previous in ("error", "failed", "timeout") and outcome not in ("error",):
            return
        self.results[report.nodeid] = {"outcome": outcome, "detail": _detail(report)}

    # -- assertions ------------------------------------------------------------------------------
    def pytest_assertrepr_compare(self, config, op, left, right):
        if op in ("==", "in", "!="):
            self.guard.forged_equality(left, right)

    def pytest_assertion_pass(self, item, lineno, orig, expl):
        """Implemented so that pytest builds explanations (and so calls the comparison hook
        above) for passing assertions too."""


if not hasattr(__import__("_pytest.hookspec").hookspec, "pytest_assertion_pass"):  # pytest < 5
    del Plugin.pytest_assertion_pass


class ConftestCheck:
    """Registered next to Plugin: wraps the loading of the conftests (and the code they import)."""

    def __init__(self, guard):
        self.guard = guard

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_load_initial_conftests(self, early_config, parser, args):
        yield
        self.guard.check(ignore=SESSION_SETUP)


def _outcome(report):
    wasxfail = hasattr(report, "wasxfail")
    if report.when == "setup":
        if report.failed:
            return "error"
        if report.skipped:
            return "xfail" if wasxfail else "skipped"
        return None
    if report.when == "call":
        if report.passed:
            return "xpass" if wasxfail else "passed"
        if report.skipped:
            return "xfail" if wasxfail else "skipped"
        return "failed"
    return "error" if report.failed else None


def _detail(report):
    try:
        text = report.longreprtext
    except Exception:
        text = str(report.longrepr or "")
    return (text or "")[-4000:]
