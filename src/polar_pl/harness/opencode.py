"""OpenCode (`opencode-ai`): OpenAI Chat by default, Anthropic or Responses through other AI SDK
provider packages (bundled in the binary), configured by an `opencode.json`."""

from __future__ import annotations

from polar_pl.harness.base import QUIET_ENV, NpmHarness, dump_json
from polar_pl.harness.protocol import GatewaySession, LaunchPlan, SandboxPaths

SDK = {
    "openai_chat": "@ai-sdk/openai-compatible",
    "anthropic": "@ai-sdk/anthropic",
    "openai_responses": "@ai-sdk/openai",
}


class OpenCode(NpmHarness):
    name = "opencode"
    package = "opencode-ai"
    bin = "opencode"
    on_node = False  # npm installs a native executable
    pinned = "1.18.33"
    providers = ("openai_chat", "anthropic", "openai_responses")

    def plan(self, session: GatewaySession, prompt: str, paths: SandboxPaths) -> LaunchPlan:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"polar/{session.model}",
            "small_model": f"polar/{session.model}",
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
            "provider": {
                "polar": {
                    "npm": SDK[self.provider],
                    "name": "polar",
                    "options": {"baseURL": f"{session.base_url}/v1", "apiKey": "{env:POLAR_API_KEY}"},
                    "models": {session.model: {"name": session.model}},
                }
            },
        }
        cfg_path = f"{paths.home}/.config/opencode/opencode.json"
        env = QUIET_ENV | {
            "POLAR_API_KEY": session.token,
            "OPENCODE_CONFIG": cfg_path,
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "XDG_CONFIG_HOME": f"{paths.home}/.config",
            "XDG_DATA_HOME": f"{paths.home}/.local/share",
            "XDG_CACHE_HOME": f"{paths.home}/.cache",
            "XDG_STATE_HOME": f"{paths.home}/.local/state",
        }
        argv = (
            *self.command(paths.harness_prefix),
            "run",
            "-m",
            f"polar/{session.model}",
            "--print-logs",
            *self.extra_args,
            prompt,
        )
        return LaunchPlan(
            argv=argv,
            env=env,
            files={cfg_path: dump_json(config)},
            log_dirs=(f"{paths.home}/.local/share/opencode/log",),
        )
