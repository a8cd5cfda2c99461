"""`polar-pl session new`: register a gateway session and print the shell lines that point a
harness at it, so a person can `eval "$(polar-pl session new ...)"` and run the CLI by hand.

The lines come from the harness's own launch spec (polar_pl.harness), the same one rollouts use;
config files the spec needs (Codex's config.toml, Pi's models.json, ...) are written under
--home, a per-session directory, and HOME is pointed there: Gemini CLI and Qwen Code read
`~/.gemini` / `~/.qwen` from HOME (without it Gemini exited 41 "Invalid auth method selected." and
Qwen wrote into the real home). The variables that only suit captured output (TERM=dumb, CI=1,
NO_COLOR=1, FORCE_COLOR=0) are left out: they would change the person's shell.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from polar_pl.utils import tokens

# For names that are an API rather than a harness ("a user's own agent").
GENERIC_ENV = {
    "openai": lambda base, tok, model: {
        "OPENAI_BASE_URL": f"{base}/v1",
        "OPENAI_API_KEY": tok,
        "OPENAI_MODEL": model,
    },
    "anthropic": lambda base, tok, model: {
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": tok,
        "ANTHROPIC_MODEL": model,
    },
    "google": lambda base, tok, model: {"GOOGLE_GEMINI_BASE_URL": base, "GEMINI_API_KEY": tok},
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    new = sub.add_parser("new", help="register a session and print its environment lines")
    new.add_argument("--gateway", required=True, metavar="URL")
    new.add_argument(
        "--harness",
        required=True,
        help="claude_code, codex, qwen_code, pi, gemini_cli, opencode, mini, or openai/anthropic/google",
    )
    tokens.add_arguments(new, "file holding the gateway's admin token (default: $POLAR_ADMIN_TOKEN)")
    new.add_argument("--provider", default=None, help="API the harness speaks, where it can speak several")
    new.add_argument("--model", default="polar", help="model name the harness asks for")
    new.add_argument("--task-id", default=None)
    new.add_argument("--group-id", default=None)
    new.add_argument(
        "--home", default=None, help="where config files go (default ~/.cache/polar-pl/sessions/<id>)"
    )
    new.add_argument(
        "--harness-prefix",
        default=os.environ.get("POLAR_HARNESS_PREFIX", ".cache/harness"),
        help="where `polar-pl harness install` put the CLIs (for the printed command line)",
    )


def _register(args) -> dict:
    import httpx

    try:
        token = tokens.admin_token(args.admin_token_file)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"polar-pl session new: {exc}") from None
    if not token:
        raise SystemExit("polar-pl session new: pass --admin-token-file or set POLAR_ADMIN_TOKEN")
    url = f"{args.gateway.rstrip('/')}/admin/sessions"
    try:
        r = httpx.post(
            url,
            headers={"authorization": f"Bearer {token}"},
            json={"harness": args.harness, "task_id": args.task_id, "group_id": args.group_id},
            timeout=30,
        )
    except httpx.HTTPError as exc:  # not up, wrong address: one line, not httpx's traceback
        raise SystemExit(f"polar-pl session new: no answer from {url}: {exc or type(exc).__name__}") from None
    if r.status_code != 200:
        raise SystemExit(f"polar-pl session new: {url} answered {r.status_code}: {r.text}")
    try:
        return r.json()
    except ValueError:
        raise SystemExit(f"polar-pl session new: {url} answered something that is not JSON") from None


def env_lines(
    harness: str,
    base_url: str,
    token: str,
    model: str,
    home: Path,
    provider: str | None = None,
    harness_prefix: str | None = None,
) -> list[str]:
    """Shell lines for one harness; writes the config files its spec needs under home."""
    if harness in GENERIC_ENV:
        env, files, argv = GENERIC_ENV[harness](base_url, token, model), {}, ()
    else:
        from polar_pl.harness import build_harness
        from polar_pl.harness.protocol import GatewaySession, SandboxPaths

        spec = build_harness(harness, **({"provider": provider} if provider else {}))
        plan = spec.plan(
            GatewaySession(base_url, token, model),
            "<task>",
            SandboxPaths(
                workdir=os.getcwd(),
                home=str(home),
                harness_prefix=str(Path(harness_prefix or ".cache/harness").resolve()),
            ),
        )
        from polar_pl.harness.base import CAPTURE_ONLY_ENV

        env = {"HOME": str(home)} | {k: v for k, v in plan.env.items() if k not in CAPTURE_ONLY_ENV}
        files, argv = plan.files, plan.argv
    for path, content in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(content)
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    if argv:
        lines.append(f"# run: {shlex.join(argv)}")
    return lines


def run(args: argparse.Namespace) -> int:
    session = _register(args)
    home = Path(args.home or Path.home() / ".cache" / "polar-pl" / "sessions" / session["session_id"])
    try:
        lines = env_lines(
            args.harness,
            session["base_url"],
            session["token"],
            args.model,
            home,
            args.provider,
            args.harness_prefix,
        )
    except ValueError as exc:
        print(f"polar-pl session new: {exc}", file=sys.stderr)
        return 2
    print(f"# session {session['session_id']} at {session['base_url']}")
    print("\n".join(lines))
    return 0
