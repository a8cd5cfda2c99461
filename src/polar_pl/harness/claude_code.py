"""Claude Code (`@anthropic-ai/claude-code`): Anthropic Messages only, configured by env vars."""

from __future__ import annotations

from polar_pl.harness.base import QUIET_ENV, NpmHarness
from polar_pl.harness.protocol import GatewaySession, LaunchPlan, SandboxPaths


class ClaudeCode(NpmHarness):
    name = "claude_code"
    package = "@anthropic-ai/claude-code"
    bin = "claude"
    on_node = False  # npm installs a native executable
    pinned = "2.1.332"
    providers = ("anthropic",)

    def plan(self, session: GatewaySession, prompt: str, paths: SandboxPaths) -> LaunchPlan:
        env = QUIET_ENV | {
            "ANTHROPIC_BASE_URL": session.base_url,
            "ANTHROPIC_API_KEY": session.token,
            "ANTHROPIC_MODEL": session.model,
            # Side calls (titles, summaries) go to the same model instead of a hard-coded Haiku.
            "ANTHROPIC_SMALL_FAST_MODEL": session.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": session.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": session.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": session.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",  # allows --dangerously-skip-permissions when the sandbox user is root
            "CLAUDE_CONFIG_DIR": f"{paths.home}/.claude",
        }
        argv = (
            *self.command(paths.harness_prefix),
            "-p",
            prompt,
            "--model",
            session.model,
            "--dangerously-skip-permissions",
            *self.extra_args,
        )
        return LaunchPlan(argv=argv, env=env, log_dirs=(f"{paths.home}/.claude/projects",))
