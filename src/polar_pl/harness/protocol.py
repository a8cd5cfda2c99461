"""The Harness protocol: how one agent CLI is installed, pointed at a gateway session and launched.

A harness does not run anything itself. `plan()` turns (gateway session, task prompt, where things
are inside the sandbox) into a `LaunchPlan` — argv, env, config files — and `harness.run.run_harness`
executes that plan in any `Sandbox`. This keeps every CLI's quirks in one small spec file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class GatewaySession:
    """What a harness needs from the gateway for one session.

    base_url: the session root, `<gateway>/s/<token>`; harnesses append `/v1/...` (or `/v1beta/...`).
    token: sent as the API key (the gateway also accepts it there).
    model: the model name the harness asks for.
    """

    base_url: str
    token: str
    model: str


@dataclass(frozen=True, slots=True)
class SandboxPaths:
    """Where things are as seen from inside the sandbox."""

    workdir: str
    home: str
    harness_prefix: str | None
    python: tuple[str, ...] = ("python3",)


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """One harness launch. `files` maps absolute in-sandbox paths to contents (written before argv).

    log_dirs: folders (in-sandbox) whose files make up the harness's own log after the run.
    answer_file: where the harness leaves its final answer, if it writes one; else stdout is read.
    """

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    log_dirs: tuple[str, ...] = ()
    answer_file: str | None = None


@runtime_checkable
class Harness(Protocol):
    """An agent CLI. `provider` is the API format it speaks to the gateway (see conf/provider/).
    `policy_exit_codes`: exit codes that are the model's doing, not a failure of the harness (mini's
    3: out of turns); such attempts train with reward 0 (rollout/outcome.py)."""

    name: str
    provider: str
    policy_exit_codes: Mapping[int, str]

    def is_installed(self, prefix: Path) -> bool:
        """True when the pinned version is already under prefix (install is then a no-op)."""

    def install(self, prefix: Path) -> None:
        """Install the pinned version under prefix (host side, needs the package registry)."""

    def prefix_problem(self, prefix: Path | None) -> str | None:
        """Called at start-up with the host folder a sandbox mounts as the harness prefix (None:
        none is set): why this harness cannot run from it, or None when it can."""

    def plan(self, session: GatewaySession, prompt: str, paths: SandboxPaths) -> LaunchPlan:
        """The argv / env / config files that run one task prompt non-interactively."""

    def answer(self, stdout: str, answer_file_text: str | None) -> str | None:
        """The final assistant message, from the answer file if the plan named one, else stdout."""
