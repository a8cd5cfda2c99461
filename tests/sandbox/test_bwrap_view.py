"""The bubblewrap view works wherever the checkout and its venv live, and shows only the runtime."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import polar_pl
from polar_pl.testing.sandbox import OWNER

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")

RUN = """
import sys
import polar_pl
from polar_pl.sandbox.local import LocalSandbox

checkout, url, owner = sys.argv[1:]
assert polar_pl.__file__.startswith(checkout), polar_pl.__file__
with LocalSandbox(owner=owner, python_packages=["sniffio"]) as sb:
    inside = sb.expose_gateway(url)
    probe = "import sniffio, sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())"
    res = sb.exec([*sb.python, "-c", probe, inside + "/ping"])
    print("agent:", res.exit_code, res.stdout.strip(), res.stderr.strip()[-500:])
    res = sb.exec(["ls", checkout, sys.executable])
    print("checkout:", res.exit_code, res.stderr.strip())
"""


def test_checkout_and_venv_under_tmp(tmp_path, gateway_stub):
    """`bwrap: execvp /tmp/.../.venv/bin/python: No such file or directory`: the sandbox's own /tmp
    hid a venv under /tmp. Now a checkout and venv there run the agent's python (with a package of
    its closure, bound from the venv) and reach the
    gateway, and the checkout and venv themselves stay out of the sandbox's view."""
    assert str(tmp_path).startswith("/tmp/")
    checkout = tmp_path / "checkout"
    shutil.copytree(
        Path(polar_pl.__file__).parent,
        checkout / "src" / "polar_pl",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    venv = checkout / ".venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages")]  # openai etc., from the test's venv
    (site / "checkout.pth").write_text("\n".join([str(checkout / "src"), *deps]) + "\n")
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", RUN, str(checkout), gateway_stub, OWNER],
        check=False, capture_output=True, text=True, timeout=120, cwd=checkout,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert lines["agent"].startswith("0 pong"), lines["agent"]
    code, err = lines["checkout"].split(" ", 1)
    assert code != "0" and "No such file or directory" in err, lines["checkout"]


def test_workspace_copied_from_a_private_folder(tmp_path):
    """`bwrap: Can't chdir to .../workspace: Permission denied`: a repository copied from a 0700
    folder (pytest's tmp dirs are) made the workspace 0700, owned by the sandbox user, and bwrap
    changed into it as root without capabilities. The sandbox user changes directory itself now."""
    from polar_pl.sandbox.local import LocalSandbox

    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "sub" / "f.txt").write_text("x\n")
    for d in (repo, repo / "sub"):
        d.chmod(0o700)
    with LocalSandbox(owner=OWNER) as sb:
        sb.put_archive(repo, sb.workdir)
        assert sb.exec(["pwd"]).stdout.strip() == sb.workdir
        res = sb.exec(["cat", "f.txt"], workdir="sub")
        assert (res.exit_code, res.stdout) == (0, "x\n"), res.stderr


def test_gateway_reached_from_a_sandbox_under_a_deep_folder(tmp_path, gateway_stub):
    """`OSError: AF_UNIX path too long`: the relay's socket lives under the sandbox root, and a root
    deep enough (pytest's long test names) made it longer than a unix socket path may be."""
    from polar_pl.sandbox.local import LocalSandbox

    base = tmp_path / ("d" * 60) / ("e" * 60)
    base.mkdir(parents=True)
    with LocalSandbox(base_dir=str(base), owner=OWNER) as sb:
        inside = sb.expose_gateway(gateway_stub)
        assert len(str(sb.root)) > 108
        probe = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
        res = sb.exec(["python3", "-c", probe, inside + "/ping"])
    assert res.stdout.strip() == "pong", res.stderr


def test_pwd_names_the_working_folder(tmp_path):
    """OpenCode takes its project folder from $PWD: with a stale one it ran its tools in `/` and
    could not write a file (bwrap's own --chdir sets PWD; the sandbox user's chdir must too)."""
    from polar_pl.sandbox.local import LocalSandbox

    with LocalSandbox(base_dir=str(tmp_path), owner=OWNER) as sb:
        res = sb.exec(["sh", "-c", 'echo "$PWD"; pwd'])
        sub = (
            sb.exec(["sh", "-c", 'echo "$PWD"'], workdir="sub")
            if sb.exec("mkdir sub").exit_code == 0
            else None
        )
        assert res.stdout.split() == [sb.workdir, sb.workdir]
        assert sub is not None and sub.stdout.strip() == f"{sb.workdir}/sub"


def test_a_workspace_alias_is_the_same_path_in_every_sandbox_and_still_each_ones_own(tmp_path):
    """sandbox.workspace_alias: a CLI that writes its working folder into its system prompt (pi,
    Claude Code) then sends byte-identical requests up to the task from every sandbox, which the
    engine's prefix cache serves. Each sandbox still sees only its own workspace there: a file one
    agent writes is absent from the other's, lands in its own host folder and its patch."""
    from polar_pl.sandbox.local import LocalSandbox

    alias = "/workspace"
    with (
        LocalSandbox(base_dir=str(tmp_path), owner=OWNER, workspace_alias=alias) as a,
        LocalSandbox(base_dir=str(tmp_path), owner=OWNER, workspace_alias=alias) as b,
    ):
        assert a.workdir != b.workdir
        for sb in (a, b):
            res = sb.exec(["sh", "-c", 'echo "$PWD"; pwd'])
            assert res.stdout.split() == [alias, alias], res
        assert a.exec(["sh", "-c", "echo 42 > result.txt && mkdir -p sub"]).exit_code == 0
        assert a.exec(["sh", "-c", "pwd"], workdir="sub").stdout.strip() == f"{alias}/sub"
        assert (Path(a.workdir) / "result.txt").read_text() == "42\n"
        assert "result.txt" in a.diff() and "+42" in a.diff()
        other = b.exec(["sh", "-c", f"ls -A {alias}; cat {alias}/result.txt; cat {a.workdir}/result.txt"])
        assert "42" not in other.stdout and other.exit_code != 0, other
        assert b.diff() == ""


@pytest.mark.parametrize(
    ("alias", "isolation", "message"),
    [
        ("/usr/workspace", "bwrap", "system folder"),
        ("/tmp", "bwrap", "system folder"),
        ("workspace", "bwrap", "absolute"),
        ("/", "bwrap", "absolute"),
        ("/a/../workspace", "bwrap", "normalised"),
        ("/workspace", "none", "isolation='bwrap'"),
    ],
)
def test_a_workspace_alias_out_of_place_is_refused_naming_the_key(alias, isolation, message):
    import warnings

    from polar_pl.sandbox.local import LocalSandbox

    with warnings.catch_warnings(), pytest.raises(ValueError, match="sandbox.workspace_alias") as err:
        warnings.simplefilter("ignore")
        LocalSandbox(isolation=isolation, owner=OWNER, workspace_alias=alias)
    assert message in str(err.value)
