"""The evaluation kit: stdlib-only code copied into evaluation sandboxes (never imported on the host,
except `guard` by its tests).

- `supervisor.py`: started by the host with a fresh key; runs one test process per file and signs
  the one report the host accepts.
- `runner.py`: the test process (unittest, or pytest with `pytest_plugin.py`); `guard.py`: the audit
  hook, fingerprints and forged-equality check it installs before any code under test is imported.

What the design stops, and what it does not (issue 13; the cases are tests/tasks/exploits.py):

Stopped: replacing unittest / pytest / runner / os / io functions or methods (fingerprints of
identities, code objects, defaults and closures, compared after every test); swapping `__code__` or
`__class__`, ctypes, gc introspection, trace / profile / audit hooks (audit hook, blocked and named);
reporting an outcome or raising skip / xfail from the code under test (attributed by call stack);
an object whose `__eq__` / `__ne__` / `__contains__` says yes to anything (probed in the hardened
assertions and in pytest's comparison hook); atexit hooks, finalizers and buffered writes after the
report (`os._exit`); `sys.exit` / `os._exit` before reporting (no report = failure or tampering);
forged `ok` / `PASSED` lines (never read for outcomes; forged pytest summaries are caught with
SWE-bench's parser); writing to the result channel before `ready`, forked processes that keep it
open; killing the supervisor (no signed report = tampering); fake results files (none is read);
sitecustomize / usercustomize / .pth, conftest.py, pytest.ini / tox.ini / setup.cfg / pyproject test
settings (`-I`, files reverted, pytest gets the task's own config with `-c`); edited or deleted test
files (the task's own copy, hashed, restored before every test process, unittest test modules loaded
from verified bytes); shadowed stdlib modules (imported before the workspace is on sys.path);
patches writing into .git/ (hooks, fsmonitor) or the kit's folder.

Not stopped: a patch written against this code that walks frames (`sys._getframe` is not an audited
operation) to the runner's objects and rewrites them or replays the handshake in-process; special-
casing the test inputs (returning the expected value for exactly the tested input); changes to the
framework through modules first imported after the snapshot; anything on `sandbox=local` without
isolation (the code under test is then host root and can reach the host evaluator itself).
"""
