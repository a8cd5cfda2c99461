"""Codex CLI (`@openai/codex`): OpenAI Responses only, configured by `$CODEX_HOME/config.toml`."""

from __future__ import annotations

import json

from polar_pl.harness.base import QUIET_ENV, NpmHarness
from polar_pl.harness.protocol import GatewaySession, LaunchPlan, SandboxPaths


def config_toml(base_url: str, model: str) -> str:
    q = json.dumps  # TOML basic strings accept JSON string escapes
    return "\n".join(
        [
            f"model = {q(model)}",
            'model_provider = "polar"',
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
            "",
            "[model_providers.polar]",
            'name = "polar"',
            f"base_url = {q(base_url + '/v1')}",
            'env_key = "POLAR_API_KEY"',
            'wire_api = "responses"',
            "request_max_retries = 1",
            "stream_max_retries = 1",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
            "apps = false",
            "",
        ]
    )


class Codex(NpmHarness):
    name = "codex"
    package = "@openai/codex"
    bin = "codex"
    pinned = "0.171.0"
    providers = ("openai_responses",)

    def plan(self, session: GatewaySession, prompt: str, paths: SandboxPaths) -> LaunchPlan:
        codex_home = f"{paths.home}/.codex"
        answer = f"{codex_home}/last-message.txt"
        env = QUIET_ENV | {"CODEX_HOME": codex_home, "POLAR_API_KEY": session.token}
        argv = (
            *self.command(paths.harness_prefix),
            "exec",
            "--dangerously-bypass-approvals-and-sandbox",
            "--skip-git-repo-check",
            "--output-last-message",
            answer,
            *self.extra_args,
            prompt,
        )
        files = {f"{codex_home}/config.toml": config_toml(session.base_url, session.model).encode()}
        return LaunchPlan(
            argv=argv, env=env, files=files, log_dirs=(f"{codex_home}/sessions",), answer_file=answer
        )
