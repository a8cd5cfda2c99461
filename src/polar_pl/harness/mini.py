"""The `mini` harness spec: our own agent (mini_agent.py), copied into the sandbox and run with the
sandbox's python. Needs no Node and no install step; speaks OpenAI Chat."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

from polar_pl.harness import mini_agent
from polar_pl.harness.base import resolve_provider
from polar_pl.harness.protocol import GatewaySession, LaunchPlan, SandboxPaths

ANSWER_FILE = ".polar/answer.txt"  # relative to the workspace; .polar is excluded from the patch


class Mini:
    name = "mini"
    # exit codes that are the model's doing (rollout/outcome.py): trained with reward 0
    policy_exit_codes: ClassVar[Mapping[int, str]] = MappingProxyType({3: "out of turns"})

    def __init__(
        self,
        provider: str | None = None,
        max_turns: int = 20,
        bash_timeout: float = 120.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        work_turns: int = 0,
        title: bool = False,
        note_tokens: int | None = None,
        tools: bool = True,
    ) -> None:
        self.provider = resolve_provider(self.name, provider, ("openai_chat",))
        self.max_turns = max_turns
        self.bash_timeout = bash_timeout
        self.temperature = temperature
        self.max_tokens = max_tokens
        if work_turns < 0:
            raise ValueError(f"harness.work_turns={work_turns}: must be >= 0")
        self.work_turns, self.title, self.note_tokens = work_turns, title, note_tokens
        self.tools = tools
        self.version = "builtin"

    def __repr__(self) -> str:
        return f"Mini(max_turns={self.max_turns})"

    def is_installed(self, prefix: Path) -> bool:
        return True

    def install(self, prefix: Path) -> None:
        """Nothing to install: the agent ships with polar_pl (stdlib only)."""

    def prefix_problem(self, prefix: Path | None) -> str | None:
        return None  # copied into the sandbox: no prefix needed

    def plan(self, session: GatewaySession, prompt: str, paths: SandboxPaths) -> LaunchPlan:
        script = f"{paths.home}/.polar/mini_agent.py"
        argv = [
            *paths.python,
            script,
            "--model",
            session.model,
            "--max-turns",
            str(self.max_turns),
            "--bash-timeout",
            str(self.bash_timeout),
            "--answer-file",
            ANSWER_FILE,
        ]
        if self.temperature is not None:
            argv += ["--temperature", str(self.temperature)]
        if self.max_tokens is not None:
            argv += ["--max-tokens", str(self.max_tokens)]
        if self.work_turns:
            argv += ["--work-turns", str(self.work_turns)]
        if self.title:
            argv.append("--title")
        if self.note_tokens is not None:
            argv += ["--note-tokens", str(self.note_tokens)]
        if not self.tools:
            argv.append("--no-tools")
        env = {
            "OPENAI_BASE_URL": f"{session.base_url}/v1",
            "OPENAI_API_KEY": session.token,
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        return LaunchPlan(
            argv=(*argv, prompt),
            env=env,
            files={script: Path(mini_agent.__file__).read_bytes()},
            answer_file=f"{paths.workdir}/{ANSWER_FILE}",
        )

    def answer(self, stdout: str, answer_file_text: str | None) -> str | None:
        text = (answer_file_text if answer_file_text is not None else stdout).strip()
        return text or None
