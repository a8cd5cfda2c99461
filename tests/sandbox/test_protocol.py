"""Every sandbox backend against the Sandbox protocol: exec, env, workdir, timeouts that kill the
whole tree, file and archive transfer, the workspace diff, limits, network, and cleanup."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from polar_pl.sandbox.protocol import Sandbox


def _procs_with(tag: str) -> list[int]:
    """Host pids whose command line contains `tag` (containers share the kernel's pid table)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if tag.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def test_is_a_sandbox(sandbox):
    assert isinstance(sandbox, Sandbox)


def test_exec_exit_code_stdout_stderr(sandbox):
    res = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (res.exit_code, res.stdout, res.stderr.strip().splitlines()[-1]) == (3, "out\n", "err")
    assert not res.timed_out and res.duration_s > 0
    res = sandbox.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME"])
    assert res.stdout.strip() == "['a b', '$HOME']"


def test_exec_env_workdir_stdin(sandbox):
    assert sandbox.exec(["pwd"]).stdout.strip() == sandbox.workdir
    sandbox.exec(["mkdir", "-p", "sub/dir"])
    assert sandbox.exec(["pwd"], workdir="sub/dir").stdout.strip() == f"{sandbox.workdir}/sub/dir"
    assert sandbox.exec(["bash", "-c", "echo $POLAR_X"], env={"POLAR_X": "hé llo"}).stdout == "hé llo\n"
    assert sandbox.exec(["cat"], stdin="piped\n").stdout == "piped\n"
    home = sandbox.exec(["bash", "-c", "echo $HOME"]).stdout.strip()
    assert home == sandbox.home and not home.startswith(sandbox.workdir)


def test_timeout_kills_children(sandbox):
    tag = f"{os.getpid() % 1000}.{time.monotonic_ns() % 100000}"
    t0 = time.monotonic()
    res = sandbox.exec(f"(sleep 1{tag}; touch survived) & nohup sleep 2{tag} & sleep 3{tag}", timeout=1.5)
    assert res.timed_out and res.exit_code != 0
    assert time.monotonic() - t0 < 10
    deadline = time.monotonic() + 5
    while _procs_with(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _procs_with(tag) == []
    assert sandbox.exec(["ls"]).stdout == ""


def test_files_and_archives(sandbox, tmp_path):
    sandbox.put_file("a/b/c.txt", b"bytes\x00\xff")
    sandbox.put_file("run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    assert sandbox.get_file("a/b/c.txt") == b"bytes\x00\xff"
    assert sandbox.get_file(f"{sandbox.workdir}/a/b/c.txt") == b"bytes\x00\xff"
    assert sandbox.exec(["./run.sh"]).stdout == "ran\n"
    with pytest.raises(FileNotFoundError):
        sandbox.get_file("missing.txt")

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (src / "tool.sh").chmod(0o755)
    (src / "link").symlink_to("pkg/mod.py")
    sandbox.put_archive(src, "repo")
    assert sandbox.exec("cat repo/link && repo/tool.sh").stdout == "X = 1\ntool\n"
    sandbox.exec("echo new > repo/pkg/new.txt")
    out = tmp_path / "out"
    sandbox.get_archive("repo", out)
    assert (out / "pkg" / "new.txt").read_text() == "new\n"
    assert (out / "link").is_symlink() and os.access(out / "tool.sh", os.X_OK)


def test_diff_against_baseline(sandbox, tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "keep.py").write_text("a = 1\n")
    (src / "gone.py").write_text("b = 2\n")
    (src / ".gitignore").write_text("*.log\n")
    sandbox.put_archive(src, sandbox.workdir)
    sandbox.exec("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm task")
    sandbox.baseline()
    assert sandbox.diff() == ""
    sandbox.exec(
        "echo 'a = 2' > keep.py && rm gone.py && mkdir -p new && echo hi > new/file.txt && "
        "mkdir -p .claude .codex sub/.qwen && echo s > .claude/state.json && echo s > sub/.qwen/x && "
        "echo t > .codex/y && echo noise > run.log"
    )
    patch = sandbox.diff()
    assert "+a = 2" in patch and "-a = 1" in patch
    assert "deleted file mode" in patch and "gone.py" in patch
    assert "new file mode" in patch and "+hi" in patch
    for hidden in (".claude", ".codex", ".qwen", "run.log"):
        assert hidden not in patch
    assert "new/file.txt" not in sandbox.diff(exclude=("new",))
    # the task repository's own git is untouched by the baseline
    assert sandbox.exec("git log --format=%s").stdout.strip() == "task"
    # and the patch applies to a pristine copy of the repository
    sandbox.put_file(f"{sandbox.home}/p.diff", patch.encode())
    check = sandbox.exec(
        "git clone -q . $HOME/pristine && cd $HOME/pristine && git apply $HOME/p.diff && echo applies"
    )
    assert check.stdout.strip() == "applies", check.stderr


def test_gateway_only_network(sandbox, gateway_stub, other_server):
    if sandbox_kind(sandbox) == "unsafe_local":
        pytest.skip("unsafe_local shares the host network by design")
    ifaces = sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()
    assert ifaces == ["lo"]
    # the gateway under any local host name: inside, the relay answers on 127.0.0.1 at its port
    url = sandbox.expose_gateway(gateway_stub.replace("127.0.0.1", "localhost"))
    assert url.startswith("http://127.0.0.1:")
    probe = (
        "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    )
    res = sandbox.exec(["python3", "-c", probe, url + "/ping"])
    assert res.stdout.strip() == "pong", res.stderr
    res = sandbox.exec(["python3", "-c", probe, other_server + "/ping"])
    assert res.exit_code != 0 and "pong" not in res.stdout


def test_memory_limit_kills(limited_sandbox):
    res = limited_sandbox.exec(["python3", "-c", "x = bytearray(700 * 1024 * 1024); print('survived')"])
    assert res.exit_code == 137 and "survived" not in res.stdout


FORK_BOMB = """
import os, signal, time
pids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        pids.append(pid)
    print("forked", len(pids))
except OSError as e:
    print("blocked after", len(pids), e.errno)
for pid in pids:
    os.kill(pid, signal.SIGKILL)
"""


def test_pid_limit_blocks_forks(limited_sandbox):
    res = limited_sandbox.exec(["python3", "-c", FORK_BOMB], timeout=30)
    words = res.stdout.split()
    assert words[:2] == ["blocked", "after"], res.stdout + res.stderr
    assert int(words[2]) < 64 and int(words[3]) == 11  # EAGAIN


def test_stop_leaves_nothing(make_sandbox):
    sb = make_sandbox()
    sb.start()
    tag = f"77{time.monotonic_ns() % 100000}"
    # one in the background, one that left the process group (setsid): both must die with stop()
    sb.exec(f"nohup sleep {tag} >/dev/null 2>&1 & setsid sleep 1{tag} >/dev/null 2>&1 < /dev/null &")
    leftovers = sandbox_leftovers(sb)
    sb.stop()
    deadline = time.monotonic() + 5
    while _procs_with(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _procs_with(tag) == []
    assert not leftovers()


def sandbox_kind(sb) -> str:
    from polar_pl.sandbox.local import LocalSandbox

    if isinstance(sb, LocalSandbox):
        return "unsafe_local" if sb.isolation == "none" else "bwrap"
    return "docker"


def sandbox_leftovers(sb):
    """A callable telling whether anything of `sb` still exists (workspace dir or container)."""
    if sandbox_kind(sb) == "docker":
        client, cid = sb.client, sb.container_id
        from docker.errors import NotFound

        def gone_check() -> bool:
            try:
                client.containers.get(cid)
                return True
            except NotFound:
                return False

        return gone_check
    root = sb.root
    return lambda: Path(root).exists()
