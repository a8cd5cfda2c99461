"""The bubblewrap view of a local sandbox: what a harness sees, as whom, and nothing more.

Read-only: `/usr` (with the `/bin`, `/lib`... links), the few `/etc` entries programs need (no
shadow, keys or package-manager credentials), a passwd/group naming the sandbox user, the Python
that runs the agent (the venv's base interpreter, its own site-packages hidden), the agent's
packages under `/opt/polar/py` (only the dependency closure of `python_packages`, bound one
top-level entry at a time out of site-packages), Node when it lives outside `/usr`, the harness
prefix, the relay script. Writable: the sandbox's own workspace, home and tmp. Private `/proc`,
`/dev`, `/tmp`; own pid, network, ipc, uts and cgroup namespaces; a new session; it dies with its
parent. Not in the view: the project checkout and its venv, the polar_pl package (the tasks'
reference patches), trace stores, other sandboxes, `/root`, `/home`, `/var`, `/run`, `/sys`.

As whom: uid 1000, no capabilities, no new privileges, no user namespace of its own. Run by root
the sandbox user is host `nobody` (userns.py says why `--unshare-user` alone is not enough); run by
anyone else it is that user, through `--unshare-user --disable-userns --cap-drop ALL`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from polar_pl.sandbox.userns import SANDBOX_ID

PYDEPS_IN = "/opt/polar/py"
RELAY_IN = "/opt/polar/relay.py"
RELAY_SCRIPT = str(Path(__file__).with_name("relay.py"))
NOBODY = 65534
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC = (
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "timezone",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "os-release",
    "debian_version",
    "profile",
    "profile.d",
    "bash.bashrc",
    "inputrc",
    "gitconfig",
    "mime.types",
    "terminfo",
    "locale.alias",
    "protocols",
    "services",
    "shells",
    "magic",
    "magic.mime",
    "python3",
    f"python{sys.version_info.major}.{sys.version_info.minor}",
)
SETPRIV = (
    "setpriv",
    f"--reuid={SANDBOX_ID}",
    f"--regid={SANDBOX_ID}",
    "--clear-groups",
    "--bounding-set=-all",
    "--inh-caps=-all",
    "--no-new-privs",
    "--",
)


@dataclass(frozen=True, slots=True)
class Runtime:
    """What the sandbox runs with: `python` (its path inside), `binds` (host path, path inside;
    read-only) and `masks` (paths inside covered by an empty tmpfs)."""

    python: str
    binds: tuple[tuple[str, str], ...]
    masks: tuple[str, ...]


@functools.cache
def runtime(python_packages: tuple[str, ...]) -> Runtime:
    """The interpreter, Node and the agent's packages, found once per process."""
    base = os.path.realpath(sys.base_prefix)
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    binds: list[tuple[str, str]] = []
    masks: list[str] = []
    if not _under(base, "/usr"):
        binds.append((base, base))
        site = {sysconfig.get_path(k, vars={"base": base, "platbase": base}) for k in ("purelib", "platlib")}
        masks += sorted(p for p in site if os.path.isdir(p) and _under(p, base))
    if not _under(python, "/usr") and not _under(python, base):
        binds.append((python, python))
    node = shutil.which("node")
    if node:
        node_prefix = os.path.dirname(os.path.dirname(os.path.realpath(node)))
        if not _under(node_prefix, "/usr"):
            binds.append((node_prefix, node_prefix))
    binds += [(RELAY_SCRIPT, RELAY_IN), *_package_binds(python_packages)]
    package_dir = os.path.realpath(Path(__file__).parents[1])  # polar_pl: the tasks' reference files
    if any(_under(package_dir, src) for src in ["/usr", *(src for src, dst in binds if src == dst)]):
        masks.append(package_dir)  # a system-wide install of polar_pl under a bound prefix
    return Runtime(python, tuple(binds), tuple(masks))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _package_binds(names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(site-packages entry, /opt/polar/py/<entry>) for every top-level module, package and
    .dist-info of the distributions `names` need (markers evaluated, no extras)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    todo = [(n, True) for n in names]
    binds: dict[str, str] = {}
    while todo:
        name, asked = todo.pop()
        key = canonicalize_name(name)
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if asked:
                raise ValueError(f"sandbox.python_packages: {name!r} is not installed") from None
            continue
        for req in map(Requirement, dist.requires or ()):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append((req.name, False))
        for top in sorted({f.parts[0] for f in dist.files or ()}):
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            src = str(dist.locate_file(top))
            binds.setdefault(f"{PYDEPS_IN}/{top}", src)
            if top.endswith(".py") and os.path.exists(pyc := importlib.util.cache_from_source(src)):
                binds.setdefault(
                    f"{PYDEPS_IN}/__pycache__/{os.path.basename(pyc)}", pyc
                )  # else compiled per run
    return [(src, dst) for dst, src in sorted(binds.items())]


def passwd_files() -> dict[str, str]:
    """/etc/passwd and /etc/group inside: root, the sandbox user (`polar`, as in Docker), nobody."""
    return {
        "passwd": f"root:x:0:0:root:/root:/bin/bash\npolar:x:{SANDBOX_ID}:{SANDBOX_ID}:polar:/home/polar:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\npolar:x:{SANDBOX_ID}:\nnogroup:x:65534:\n",
    }


class _Args:
    """bwrap arguments; every mount point's missing parents are made first with mode 0755 (bwrap
    would copy the host's modes: /root 0700 would hide a bound /root/.pyenv from the sandbox user)."""

    def __init__(self) -> None:
        self.argv: list[str] = []
        self.dirs: set[str] = {"/", "/proc", "/dev", "/tmp", "/etc"}
        self.mounts: list[str] = ["/usr"]

    def add(self, *args: str) -> None:
        self.argv += args

    def mount(self, kind: str, src: str | None, dst: str) -> None:
        parents = []
        for parent in Path(dst).parents:
            if str(parent) in self.dirs or any(_under(str(parent), m) for m in self.mounts):
                break
            parents.append(str(parent))
        for d in reversed(parents):
            self.add("--perms", "0755", "--dir", d)
            self.dirs.add(d)
        self.add(kind, *([src] if src is not None else []), dst)
        self.mounts.append(dst)


def argv(
    rt: Runtime,
    *,
    writable: list[str],
    readonly: list[tuple[str, str]],
    harness_prefix: str | None,
    cwd: str,
    userns: tuple[int, int] | None,
    aliases: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """The bwrap command line up to and including `--` (and the uid drop when run as root).
    `writable`: host paths bound read-write at the same path; `readonly`: (host path, path inside);
    `aliases`: (writable host path, a second path inside it is bound read-write at)."""
    a = _Args()
    if userns is not None:  # the three capabilities are for setpriv, which drops them all
        a.add(
            "bwrap",
            "--userns",
            str(userns[0]),
            "--userns2",
            str(userns[1]),
            "--uid",
            "0",
            "--gid",
            "0",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--cap-add",
            "CAP_SETPCAP",
        )
    else:
        a.add(
            "bwrap",
            "--unshare-user",
            "--uid",
            str(SANDBOX_ID),
            "--gid",
            str(SANDBOX_ID),
            "--disable-userns",
            "--cap-drop",
            "ALL",
        )
    a.add(
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--new-session",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
    )
    for name in ROOT_LINKS:
        host = f"/{name}"
        if os.path.islink(host):
            a.add("--symlink", os.readlink(host), host)
        elif os.path.isdir(host):
            a.mount("--ro-bind", host, host)
    a.add("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/etc")
    for name in ETC:
        if os.path.exists(f"/etc/{name}"):
            a.mount("--ro-bind", f"/etc/{name}", f"/etc/{name}")
    for src, dst in (*rt.binds, *readonly):
        a.mount("--ro-bind", src, dst)
    if harness_prefix and os.path.isdir(harness_prefix):  # optional: bwrap refuses a missing source
        a.mount("--ro-bind", harness_prefix, harness_prefix)
    for path in rt.masks:
        a.mount("--tmpfs", None, path)
    for path in writable:
        a.mount("--bind", path, path)
    for src, dst in aliases:
        a.mount("--bind", src, dst)
    if userns is None:
        a.add("--chdir", cwd, "--")
    else:  # bwrap would chdir as root without capabilities: a 0700 workspace of nobody refuses that
        # (and PWD as bwrap's --chdir sets it: OpenCode takes its project folder from PWD)
        a.add("--", *SETPRIV, "env", f"--chdir={cwd}", "--", f"PWD={cwd}")
    return a.argv
