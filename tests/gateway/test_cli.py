"""`polar-pl gateway` as a real process and `polar-pl session new` printing the lines a person
evals to point a harness at a session."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import httpx
import openai

from polar_pl.gateway.store.traces import read_records
from polar_pl.utils.serving import free_port


def _env_from_lines(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("export "):
            k, _, v = line[7:].partition("=")
            env[k] = shlex.split(v)[0] if v else ""
    return env


def test_gateway_process_and_session_new(engine, tmp_path):
    port = free_port()
    store = tmp_path / "traces.db"
    env = {**os.environ, "POLAR_ADMIN_TOKEN": "admin-secret"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "polar_pl.cli",
            "gateway",
            "--upstream",
            engine.url,
            "--port",
            str(port),
            "--store",
            str(store),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        out = {}
        for harness in ("qwen_code", "claude_code", "gemini_cli", "codex"):
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "polar_pl.cli",
                    "session",
                    "new",
                    "--gateway",
                    url,
                    "--harness",
                    harness,
                    "--model",
                    "tiny",
                    "--home",
                    str(tmp_path / harness),
                ],
                check=False,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 0, r.stderr
            out[harness] = _env_from_lines(r.stdout)
        q = out["qwen_code"]
        assert q["OPENAI_BASE_URL"].startswith(f"{url}/s/") and q["OPENAI_MODEL"] == "tiny"
        c = out["claude_code"]
        assert c["ANTHROPIC_BASE_URL"].startswith(f"{url}/s/") and c["ANTHROPIC_API_KEY"].startswith("plr-")
        assert out["gemini_cli"]["GEMINI_API_KEY"].startswith("plr-")
        assert (tmp_path / "codex").exists()  # codex's config.toml lives under its home
        r = openai.OpenAI(
            base_url=q["OPENAI_BASE_URL"], api_key=q["OPENAI_API_KEY"], max_retries=0
        ).chat.completions.create(model=q["OPENAI_MODEL"], messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "Hello from the engine."
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "polar_pl.cli",
                "session",
                "new",
                "--gateway",
                url,
                "--harness",
                "qwen_code",
                "--admin-token",
                "wrong",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        assert bad.returncode != 0 and "401" in bad.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    (rec,) = read_records(store)
    assert rec.status == "ok" and rec.provider == "openai_chat"


def test_generated_admin_token_is_printed(engine, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "POLAR_ADMIN_TOKEN"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "polar_pl.cli",
            "gateway",
            "--upstream",
            engine.url,
            "--port",
            str(port),
            "--store",
            str(tmp_path / "t.db"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        proc.stdout.readline()
        line = proc.stdout.readline()
        assert line.startswith("admin token: ")
        token = line.split(": ", 1)[1].strip()
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/admin/sessions",
                    json={},
                    headers={"authorization": f"Bearer {token}"},
                    timeout=1,
                )
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def test_gateway_process_options_faithful_cap_and_pause(engine, tmp_path, tiny_model_dir):
    """--tokenizer-dir turns token-faithful prompts on, --max-tokens-cap clips, the admin pause
    routes answer."""
    port, store = free_port(), tmp_path / "traces.db"
    cmd = [sys.executable, "-m", "polar_pl.cli", "gateway", "--upstream", engine.url, "--port", str(port)]
    cmd += ["--store", str(store), "--tokenizer-dir", str(tiny_model_dir), "--max-tokens-cap", "3"]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "POLAR_ADMIN_TOKEN": "adm"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        admin = httpx.Client(base_url=url, headers={"authorization": "Bearer adm"})
        assert admin.get("/admin/stats").json()["gateway/token_faithful"] == 1.0
        token = admin.post("/admin/sessions", json={}).json()["token"]
        r = openai.OpenAI(base_url=f"{url}/s/{token}/v1", api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=100
        )
        assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
        assert admin.post("/admin/pause", json={"mode": "drain"}).json()["paused"] is True
        assert admin.post("/admin/resume").json()["paused"] is False
        assert engine.backend.requests[-1].chat is None  # the token-in route
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    (rec,) = read_records(store)
    assert "max_tokens capped: requested 100, sent 3" in rec.notes and "prompt" not in rec.normalized_request
