"""Every harness, in every backend, through the real gateway to a scripted engine: a two-turn tool
task (the model asks to write a file with the harness's own shell tool, then answers).

Asserted: exit 0, the file exists with the expected content, the patch shows it, the final answer
is read, the harness's own log is collected, and the gateway's store holds the calls.
Tool names come from the recorded CLI requests (fixtures/harness-captures).
"""

from __future__ import annotations

import json

import pytest

from polar_pl.harness import build_harness
from polar_pl.harness.protocol import GatewaySession
from polar_pl.harness.run import run_harness
from polar_pl.testing.smoke import ANSWER, PROMPT, RESULT_FILE, SHELL_TOOL, script_for


def _main_calls(records) -> list:
    return [r for r in records if r.call_kind == "main"]


# Every harness in both isolating backends (no network but the relayed gateway).
CASES = [(n, b) for b in ("bwrap", "docker") for n in SHELL_TOOL]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "backend"), CASES)
def test_two_turn_tool_task(name, backend, backend_sandbox, gateway, script, harness_prefix):
    _two_turn(build_harness(name), backend, backend_sandbox, gateway, script, harness_prefix)


# The other API formats of the harnesses that speak several (the gateway translates each).
PROVIDER_CASES = [("pi", p) for p in ("openai_responses", "anthropic", "google")] + [
    (n, p) for n in ("qwen_code", "opencode") for p in ("anthropic", "openai_responses")
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bwrap"])
@pytest.mark.parametrize(("name", "provider"), PROVIDER_CASES)
def test_two_turn_tool_task_other_providers(
    name, provider, backend, backend_sandbox, gateway, script, harness_prefix
):
    _two_turn(
        build_harness(name, provider=provider), backend, backend_sandbox, gateway, script, harness_prefix
    )


def _two_turn(harness, backend, backend_sandbox, gateway, script, harness_prefix):
    name = harness.name
    if not harness.is_installed(harness_prefix):
        pytest.skip(f"{name} is not installed: polar-pl harness install {name} --prefix {harness_prefix}")
    content = f"hello from {name} in {backend}"
    script.reply = script_for(name, content)
    handle = gateway.create_session(task_id=f"e2e-{name}", harness=name)
    session = GatewaySession(base_url=handle.base_url, token=handle.token, model="polar-tiny")

    result = run_harness(harness, backend_sandbox, session, PROMPT, timeout=240)

    detail = f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.exit_code == 0 and not result.timed_out, detail
    records = gateway.records(handle.session_id)
    calls = [(r.call_kind, r.path, r.status, r.finish_reason) for r in records]
    wrote = backend_sandbox.exec(["test", "-f", RESULT_FILE]).exit_code == 0
    assert wrote, f"{RESULT_FILE} not written; calls {calls}\n{detail}"
    assert backend_sandbox.get_file(RESULT_FILE).decode() == content
    assert "+++ b/result.txt" in result.patch and f"+{content}" in result.patch
    assert result.answer and ANSWER in result.answer, detail
    main = _main_calls(records)
    assert len(main) >= 2, [(r.call_kind, r.path, r.status) for r in records]
    assert all(r.status == "ok" for r in main), [(r.status, r.error) for r in main]
    assert all(r.response_ids and len(r.response_ids) == len(r.response_logprobs) for r in main)
    # the second main call carries the tool's result back to the model
    assert content in json.dumps(main[-1].raw_request) or "result.txt" in json.dumps(main[-1].raw_request)
    if name != "mini":
        assert result.log, "the harness's own log was not collected"
