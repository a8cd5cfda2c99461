"""Qwen Code (`@qwen-code/qwen-code`): OpenAI Chat by default; Anthropic or Responses by auth type."""

from __future__ import annotations

from pathlib import Path

from polar_pl.harness.base import QUIET_ENV, NpmHarness, dump_json
from polar_pl.harness.protocol import GatewaySession, LaunchPlan, SandboxPaths

AUTH_TYPE = {"openai_chat": "openai", "anthropic": "anthropic", "openai_responses": "openai-responses"}


class QwenCode(NpmHarness):
    name = "qwen_code"
    package = "@qwen-code/qwen-code"
    bin = "qwen"
    pinned = "0.24.4"
    providers = ("openai_chat", "anthropic", "openai_responses")

    def post_install(self, prefix: Path) -> None:
        # The package ships its ripgrep without the exec bit; the CLI then falls back to a slow grep.
        vendor = self.home_dir(prefix) / "node_modules" / self.package / "vendor" / "ripgrep"
        for rg in vendor.glob("*/rg"):
            rg.chmod(0o755)

    def plan(self, session: GatewaySession, prompt: str, paths: SandboxPaths) -> LaunchPlan:
        if self.provider == "anthropic":
            creds = {
                "ANTHROPIC_BASE_URL": session.base_url,
                "ANTHROPIC_API_KEY": session.token,
                "ANTHROPIC_MODEL": session.model,
            }
        else:
            creds = {
                "OPENAI_BASE_URL": f"{session.base_url}/v1",
                "OPENAI_API_KEY": session.token,
                "OPENAI_MODEL": session.model,
            }
        settings = {
            "privacy": {"usageStatisticsEnabled": False},
            "memory": {"enableManagedAutoMemory": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "telemetry": {"enabled": False},
            "security": {"auth": {"selectedType": AUTH_TYPE[self.provider]}},
        }
        argv = (
            *self.command(paths.harness_prefix),
            "--yolo",
            "--auth-type",
            AUTH_TYPE[self.provider],
            "-m",
            session.model,
            *self.extra_args,
            "-p",
            prompt,
        )
        return LaunchPlan(
            argv=argv,
            env=QUIET_ENV | creds | {"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"},
            files={f"{paths.home}/.qwen/settings.json": dump_json(settings)},
            log_dirs=(f"{paths.home}/.qwen/tmp", f"{paths.home}/.qwen/projects"),
        )
