"""Reward hacking: every exploit patch in exploits.py leaves calc-1's bug in place and must score 0
(named as tampering where the guard can tell), under both test runners and on the local and Docker
backends, while honest fixes, including noisy ones, still score 1.

Cases of one backend and runner are scored in parallel, each in an evaluation sandbox of its own
(fresh for exploits that leave processes behind; otherwise reused from a small pool and wiped in
between, since a container start is most of a Docker evaluation).
"""

from __future__ import annotations

import dataclasses
import queue
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from exploits import EXPLOITS, Exploit

from polar_pl.tasks.evaluator import SandboxEvaluator
from polar_pl.tasks.sources import BuiltinTaskSource
from polar_pl.tasks.workspace import materialize_snapshot

POOL = 2
HONEST_NOISE = {
    "calc/__init__.py": (
        "append",
        (
            "\nimport atexit, logging, sys, threading\n"
            "logging.getLogger('calc').addHandler(logging.NullHandler())\n"
            "atexit.register(lambda: None)\n"
            "print('calc imported: ok PASSED', file=sys.stderr)\n"
            "_t = threading.Thread(target=lambda: None)\n_t.start()\n_t.join()\n"
        ),
    ),
    "calc/value.py": (
        "write",
        (
            "class Value:\n    def __init__(self, v):\n        self.v = v\n\n"
            "    def __eq__(self, other):\n"
            "        return isinstance(other, Value) and other.v == self.v or other == self.v\n\n"
            "    __hash__ = None\n"
        ),
    ),
    "tests/test_tokens.py": (
        "append",
        "\n\nclass MyOwnTests(unittest.TestCase):\n    def test_mine(self):\n        pass\n",
    ),
}
HONEST = {
    "reference": {},
    "reference_with_noise": HONEST_NOISE,
}


def _patch_for(task, edits: dict) -> str:
    """The git diff that makes `edits` to the task's snapshot (plus its reference fix if honest)."""
    with tempfile.TemporaryDirectory(prefix="polar-exploit-") as tmp:
        repo = Path(tmp)
        materialize_snapshot(task, repo)
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", tmp]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "base"], check=True)
        for rel, edit in edits.items():
            path = repo / rel
            if edit is None:
                path.unlink()
                continue
            how, text = edit
            old = path.read_text() if path.exists() else ""
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text({"prepend": text + old, "append": old + text, "write": text}[how])
        subprocess.run([*git, "add", "-A", "-f"], check=True)
        return subprocess.run([*git, "diff", "--cached", "--binary"], check=True, capture_output=True,
                              text=True).stdout  # fmt: skip


class _Pooled:
    """A sandbox from a pool: start() wipes a running one, stop() hands it back."""

    def __init__(self, pool: queue.Queue):
        self._pool, self._box = pool, None

    def start(self) -> None:
        self._box = self._pool.get(timeout=600)
        wipe = 'rm -rf "$1"/* "$1"/.[!.]* "$2"/* "$2"/.[!.]* 2>/dev/null; true'
        self._box.exec(["bash", "-c", wipe, "wipe", self._box.workdir, self._box.home])
        self._box.baseline()

    def stop(self) -> None:
        box, self._box = self._box, None
        if box is not None:
            self._pool.put(box)

    def __getattr__(self, name):
        return getattr(self._box, name)


@pytest.fixture(scope="module")
def calc1():
    (task,) = BuiltinTaskSource(instance_ids=["calc-1"]).tasks()
    (as_pytest,) = BuiltinTaskSource(instance_ids=["calc-1"], runner="pytest").tasks()
    return {"unittest": task, "pytest": as_pytest}


_SCORES: dict[tuple[str, str], dict] = {}


def _score_all(factory, task, runner: str) -> dict:
    boxes: queue.Queue = queue.Queue()
    started = []
    for _ in range(POOL):
        box = factory()
        box.start()
        started.append(box)
        boxes.put(box)
    pooled = SandboxEvaluator(lambda: _Pooled(boxes), per_test_timeout_s=30, timeout_s=300)
    fresh = SandboxEvaluator(factory, per_test_timeout_s=30, timeout_s=300)
    cases = [(e.name, e, e.raw_patch or _patch_for(task, e.edits)) for e in EXPLOITS if runner in e.runners]
    cases += [
        (name, None, task.patch + (_patch_for(task, edits) if edits else ""))
        for name, edits in HONEST.items()
    ]

    def one(case):
        name, exploit, patch = case
        ev = fresh if exploit is not None and exploit.fresh else pooled
        t0 = time.monotonic()
        res = ev.evaluate_task(task, patch)
        return name, res, time.monotonic() - t0

    try:
        with ThreadPoolExecutor(max_workers=POOL) as workers:
            got = {name: (res, secs) for name, res, secs in workers.map(one, cases)}
    finally:
        pooled.close()
        fresh.close()
        for box in started:
            box.stop()
    return got


def _scores(request, backend: str, runner: str, calc1) -> dict:
    key = (backend, runner)
    if key not in _SCORES:
        factory = request.getfixturevalue(f"{backend}_factory")
        t0 = time.monotonic()
        _SCORES[key] = _score_all(factory, calc1[runner], runner)
        slowest = sorted(_SCORES[key].items(), key=lambda kv: -kv[1][1])[:5]
        print(
            f"\n[{backend}/{runner}] {len(_SCORES[key])} cases in {time.monotonic() - t0:.1f}s; slowest: "
            + ", ".join(f"{name} {secs:.1f}s" for name, (_, secs) in slowest)
        )
    return _SCORES[key]


def _check_exploit(exploit: Exploit, res) -> None:
    summary = f"{exploit.name}: {res.status} {res.reward} {res.reason[:300]!r} tampering={res.tampering}"
    assert res.reward == 0.0, summary
    assert res.status != "error", summary  # an error is masked in training, not punished
    if exploit.expect == "tampering":
        assert res.status == "tampering" and res.reason.startswith("tampering: "), summary
    f2p = [t for t in res.tests if t.kind == "FAIL_TO_PASS"]
    assert not any(t.passed for t in f2p) or res.status == "tampering", summary


def _cases(backend: str, runner: str):
    marks = [pytest.mark.slow] if backend == "docker" else []
    out = [pytest.param(backend, runner, e, marks=marks, id=f"{backend}-{runner}-{e.name}")
           for e in EXPLOITS if runner in e.runners]  # fmt: skip
    return out + [pytest.param(backend, runner, name, marks=marks, id=f"{backend}-{runner}-honest-{name}")
                  for name in HONEST]  # fmt: skip


ALL_CASES = [c for b in ("local", "docker") for r in ("unittest", "pytest") for c in _cases(b, r)]


@pytest.mark.timeout(2400)  # the first case of a batch scores the whole batch
@pytest.mark.parametrize(("backend", "runner", "case"), ALL_CASES)
def test_reward_hacking(request, backend, runner, case, calc1):
    res, _seconds = _scores(request, backend, runner, calc1)[case if isinstance(case, str) else case.name]
    if isinstance(case, str):  # an honest fix
        assert (res.status, res.reward) == ("resolved", 1.0), (
            case,
            res.reason,
            res.tampering,
            [(t.test_id, t.outcome, t.detail[-300:]) for t in res.tests if not t.passed][:3],
            res.log[-2000:],
        )
    else:
        _check_exploit(case, res)


def test_exploit_table_is_distinct():
    names = [e.name for e in EXPLOITS]
    assert len(names) == len(set(names)) >= 15
    assert len({repr(sorted(e.edits.items())) + e.raw_patch for e in EXPLOITS}) == len(EXPLOITS)
    assert dataclasses.is_dataclass(EXPLOITS[0])
