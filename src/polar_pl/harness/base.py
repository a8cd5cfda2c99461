"""Shared parts of the harness specs: provider validation and pinned npm installs."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

PROVIDERS = ("anthropic", "openai_chat", "openai_responses", "google")
NPM_LOCKS = Path(__file__).parent / "npm_locks"

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
            version == self.version and (self.home_dir(prefix) / "node_modules" / ".bin" / self.bin).exists()
        )

    def install(self, prefix: Path) -> None:
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
        if not self.is_installed(Path(prefix)):
            return f"is {prefix}, which does not hold {self.package} {self.version}"
        return None

    def post_install(self, prefix: Path) -> None:
        """Fix-ups npm leaves undone (idempotent; `harness install` runs it on existing installs too)."""

    def executable(self, prefix: str | None) -> str:
        if prefix is None:
            raise ValueError(
                f"harness {self.name} needs a harness prefix in the sandbox "
                f"(polar-pl harness install {self.name} --prefix DIR; sandbox.harness_prefix=DIR)"
            )
        return f"{prefix}/{self.name}/node_modules/.bin/{self.bin}"

    def answer(self, stdout: str, answer_file_text: str | None) -> str | None:
        text = (answer_file_text if answer_file_text is not None else stdout).strip()
        return text or None


def dump_json(obj) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()
