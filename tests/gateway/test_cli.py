"""`polar-pl gateway` as a real process and `polar-pl session new` printing the lines a person
evals to point a harness at a session."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_gateway_process_and_session_new(engine, tmp_path, tiny_model_dir):
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
            "--tokenizer-dir",  # the scripted engine reports no model directory
            str(tiny_model_dir),
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
        # Gemini / Qwen find their settings under HOME (Gemini exited 41 "Invalid auth method
        # selected." without it); capture-only variables stay out of the person's shell
        for name in ("gemini_cli", "qwen_code"):
            assert out[name]["HOME"] == str(tmp_path / name)
            assert not {"TERM", "CI", "NO_COLOR", "FORCE_COLOR"} & set(out[name])
        assert (tmp_path / "gemini_cli" / ".gemini" / "settings.json").exists()
        assert (tmp_path / "codex").exists()  # codex's config.toml lives under its home
        r = openai.OpenAI(
            base_url=q["OPENAI_BASE_URL"], api_key=q["OPENAI_API_KEY"], max_retries=0
        ).chat.completions.create(model=q["OPENAI_MODEL"], messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "Hello from the engine."
        (tmp_path / "wrong-token").write_text("wrong\n")
        new = [
            sys.executable,
            "-m",
            "polar_pl.cli",
            "session",
            "new",
            "--gateway",
            url,
            "--harness",
            "qwen_code",
        ]
        bad = subprocess.run(
            [*new, "--admin-token-file", str(tmp_path / "wrong-token")],
            check=False,
            capture_output=True,
            text=True,
        )
        assert bad.returncode != 0 and "401" in bad.stderr
        on_cmdline = subprocess.run(
            [*new, "--admin-token", "adm"], check=False, capture_output=True, text=True
        )
        assert on_cmdline.returncode == 2 and "--admin-token-file" in on_cmdline.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    (rec,) = read_records(store)
    assert rec.status == "ok" and rec.provider == "openai_chat"


def test_generated_admin_token_goes_to_a_file(engine, tmp_path):
    """The token was printed, and `--admin-token VALUE` put it on the command line (readable in
    /proc/<pid>/cmdline by every process on the host): now it is written to a file of mode 0600."""
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
            "--no-token-faithful",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        proc.stdout.readline()
        line = proc.stdout.readline()
        assert line == f"admin token in {tmp_path / 't.admin-token'}\n"
        token_file = tmp_path / "t.admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert token.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
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


def _start_gateway(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = proc.stdout.readline()
    url = cmd[cmd.index("--port") + 1]
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{url}/health", timeout=1).raise_for_status()
            return proc, first
        except httpx.HTTPError:
            assert proc.poll() is None and time.monotonic() < deadline, first + proc.stdout.read()
            time.sleep(0.2)


def test_readme_gateway_in_front_of_the_embedded_engine(tiny_model_dir, tmp_path):
    """The README's gateway line in front of `polar-pl engine`: no tokenizer flag, and the gateway
    learns the tokenizer from the engine. Before: token-faithful was off (a clean four-turn
    conversation merged into 4 rows instead of 1) and Anthropic count_tokens answered 502
    "token count failed: Not Found" (it asked the engine's /tokenize, which it did not serve)."""
    import anthropic

    from polar_pl.engine.embedded import EmbeddedEngine
    from polar_pl.trajectory import PrefixBuilder

    engine = EmbeddedEngine(tiny_model_dir, served_model_name="tiny", num_threads=1).start()
    port, store = free_port(), tmp_path / "traces.db"
    cmd = [sys.executable, "-m", "polar_pl.cli", "gateway", "--upstream", engine.url, "--port", str(port)]
    cmd += ["--store", str(store), "--max-tokens-cap", "12", "--cap-policy", "end_turn"]
    proc, first = _start_gateway(cmd, {**os.environ, "POLAR_ADMIN_TOKEN": "adm"})
    try:
        assert f"token-faithful on (tokenizer {tiny_model_dir}" in first
        url = f"http://127.0.0.1:{port}"
        token = httpx.post(f"{url}/admin/sessions", json={}, headers={"authorization": "Bearer adm"}).json()[
            "token"
        ]
        claude = anthropic.Anthropic(base_url=f"{url}/s/{token}", api_key=token, max_retries=0)
        count = claude.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert count.input_tokens > 0
        client = openai.OpenAI(base_url=f"{url}/s/{token}/v1", api_key=token, max_retries=0)
        messages = [{"role": "system", "content": "You are terse."}]
        for turn in range(4):
            messages.append({"role": "user", "content": f"turn {turn}"})
            r = client.chat.completions.create(model="tiny", messages=messages, temperature=1.0)
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        engine.stop()
    records = [r for r in read_records(store) if r.path.endswith("/chat/completions")]
    assert len(records) == 4
    result = PrefixBuilder().build(records, reward=0.0)
    assert result.stats.rows == 1 and result.stats.num_breaks == 0, result.stats


def test_gateway_without_a_tokenizer_says_how_to_get_one(engine, tmp_path):
    """An engine that reports no model directory on this machine: the gateway refuses to start
    silently token-unfaithful and names the two flags."""
    port = free_port()
    cmd = [sys.executable, "-m", "polar_pl.cli", "gateway", "--upstream", engine.url, "--port", str(port)]
    r = subprocess.run(
        [*cmd, "--store", str(tmp_path / "t.db")], check=False, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "--tokenizer-dir" in r.stderr and "--no-token-faithful" in r.stderr


def test_session_new_without_a_gateway_says_so_in_one_line(tmp_path):
    """Against a gateway that is not up it printed httpx's full traceback."""
    url = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run(
        [sys.executable, "-m", "polar_pl.cli", "session", "new", "--gateway", url, "--harness", "qwen_code"],
        check=False,
        env={**os.environ, "POLAR_ADMIN_TOKEN": "admin-secret"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("polar-pl session new:") and url in line and "refused" in line, line
