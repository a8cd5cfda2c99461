"""Run one harness on one task prompt inside a sandbox, against one gateway session."""

from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import dataclass

from polar_pl.harness.protocol import GatewaySession, Harness, SandboxPaths
from polar_pl.sandbox.protocol import Sandbox

LOG_LIMIT = 4_000_000  # bytes of harness log kept per run


@dataclass(frozen=True, slots=True)
class HarnessResult:
    """What one harness run left behind.

    exit_code: the CLI's exit status (137 after a timeout kill); log: the harness's own session
    files (transcripts, debug logs), each under a `==> path <==` header; answer: its final message;
    patch: `git apply`-able diff of the workspace against the baseline (harness state excluded).
    """

    harness: str
    provider: str
    exit_code: int
    stdout: str
    stderr: str
    log: str
    timed_out: bool
    duration_s: float
    answer: str | None
    patch: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def sandbox_paths(sandbox: Sandbox) -> SandboxPaths:
    return SandboxPaths(
        workdir=sandbox.workdir,
        home=getattr(sandbox, "home", None) or f"{sandbox.workdir}/.polar/home",
        harness_prefix=getattr(sandbox, "harness_prefix", None),
        python=tuple(getattr(sandbox, "python", None) or ("python3",)),
    )


def run_harness(
    harness: Harness,
    sandbox: Sandbox,
    session: GatewaySession,
    prompt: str,
    *,
    timeout: float | None = 600.0,
    baseline: bool = True,
) -> HarnessResult:
    """Write the harness's config into the sandbox, run it to exit or timeout, collect the results.

    baseline: snapshot the workspace right before the launch, so the patch is the harness's work
    only (pass False when the caller took the baseline itself, e.g. before task setup steps that
    belong in the patch).
    """
    expose = getattr(sandbox, "expose_gateway", None)
    if expose is not None:
        session = dataclasses.replace(session, base_url=expose(session.base_url))
    paths = sandbox_paths(sandbox)
    plan = harness.plan(session, prompt, paths)
    for path, data in plan.files.items():
        sandbox.put_file(path, data, mode=0o600)
    if baseline:
        sandbox.baseline()
    t0 = time.monotonic()
    res = sandbox.exec(list(plan.argv), env=plan.env, timeout=timeout)
    duration = time.monotonic() - t0
    answer_text = None
    if plan.answer_file:
        try:
            answer_text = sandbox.get_file(plan.answer_file).decode(errors="replace")
        except (OSError, RuntimeError, ValueError, KeyError):
            answer_text = None  # the harness died before writing it
    return HarnessResult(
        harness=harness.name,
        provider=harness.provider,
        exit_code=res.exit_code,
        stdout=res.stdout,
        stderr=res.stderr,
        log=read_logs(sandbox, plan.log_dirs),
        timed_out=res.timed_out,
        duration_s=duration,
        answer=harness.answer(res.stdout, answer_text),
        patch=sandbox.diff(),
    )


def read_logs(sandbox: Sandbox, dirs: tuple[str, ...]) -> str:
    """Concatenate the files under `dirs` (sorted, each with a header), capped at LOG_LIMIT bytes."""
    if not dirs:
        return ""
    script = (
        "for d in " + " ".join(shlex.quote(d) for d in dirs) + "; do "
        '[ -d "$d" ] || continue; find "$d" -type f | sort | while IFS= read -r f; do '
        'printf "==> %s <==\\n" "$f"; cat "$f"; printf "\\n"; done; done '
        f"| head -c {LOG_LIMIT}"
    )
    return sandbox.exec(["bash", "-c", script], timeout=60).stdout
