"""Pi (`@mariozechner/pi-coding-agent`): speaks all four APIs, chosen in `~/.pi/agent/models.json`."""

from __future__ import annotations

from polar_pl.harness.base import QUIET_ENV, NpmHarness, dump_json
from polar_pl.harness.protocol import GatewaySession, LaunchPlan, SandboxPaths

# provider -> (pi's api name, path appended to the session base URL)
API = {
    "openai_chat": ("openai-completions", "/v1"),
    "openai_responses": ("openai-responses", "/v1"),
    "anthropic": ("anthropic-messages", ""),
    "google": ("google-generative-ai", ""),
}


class Pi(NpmHarness):
    name = "pi"
    package = "@mariozechner/pi-coding-agent"
    bin = "pi"
    pinned = "0.73.1"
    providers = ("openai_chat", "openai_responses", "anthropic", "google")

    def plan(self, session: GatewaySession, prompt: str, paths: SandboxPaths) -> LaunchPlan:
        api, suffix = API[self.provider]
        models = {
            "providers": {
                "polar": {
                    "baseUrl": session.base_url + suffix,
                    "api": api,
                    "apiKey": "POLAR_API_KEY",  # pi reads the key from this env var
                    "models": [{"id": session.model, "name": session.model}],
                }
            }
        }
        agent_dir = f"{paths.home}/.pi/agent"
        env = QUIET_ENV | {
            "POLAR_API_KEY": session.token,
            "PI_OFFLINE": "1",
            "PI_CODING_AGENT_DIR": agent_dir,
        }
        argv = (
            *self.command(paths.harness_prefix),
            "--provider",
            "polar",
            "--model",
            session.model,
            *self.extra_args,
            "-p",
            prompt,
        )
        return LaunchPlan(
            argv=argv,
            env=env,
            files={f"{agent_dir}/models.json": dump_json(models)},
            log_dirs=(f"{agent_dir}/sessions",),
        )
