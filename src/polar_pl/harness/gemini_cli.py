"""Gemini CLI (`@google/gemini-cli`): Google generateContent only, via env and settings.json."""

from __future__ import annotations

from polar_pl.harness.base import QUIET_ENV, NpmHarness, dump_json
from polar_pl.harness.protocol import GatewaySession, LaunchPlan, SandboxPaths


class GeminiCli(NpmHarness):
    name = "gemini_cli"
    package = "@google/gemini-cli"
    bin = "gemini"
    pinned = "0.61.0"
    providers = ("google",)

    def plan(self, session: GatewaySession, prompt: str, paths: SandboxPaths) -> LaunchPlan:
        env = QUIET_ENV | {
            "GOOGLE_GEMINI_BASE_URL": session.base_url,
            "GEMINI_API_KEY": session.token,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_CLI_NO_RELAUNCH": "true",  # no child re-launch with a bigger heap: one process tree
        }
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "telemetry": {"enabled": False},
        }
        # -m pins the model: without it the CLI first asks a router model which one to use.
        argv = (
            *self.command(paths.harness_prefix),
            "--yolo",
            "-m",
            session.model,
            *self.extra_args,
            "-p",
            prompt,
        )
        return LaunchPlan(
            argv=argv,
            env=env,
            files={f"{paths.home}/.gemini/settings.json": dump_json(settings)},
            log_dirs=(f"{paths.home}/.gemini/tmp",),
        )
