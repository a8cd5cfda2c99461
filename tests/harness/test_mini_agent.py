"""The mini agent's tools and exit codes (its model loop is covered end to end in test_e2e.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from polar_pl.harness import mini_agent
from polar_pl.utils.serving import free_port


def test_tools_write_edit_and_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "wrote 6 characters" in mini_agent.run_tool(
        "write_file", '{"path": "a/b.txt", "content": "x = 1\\n"}', 5
    )
    assert mini_agent.run_tool(
        "str_replace", '{"path": "a/b.txt", "old_str": "x = 1", "new_str": "x = 2"}', 5
    )
    assert Path("a/b.txt").read_text() == "x = 2\n"
    out = mini_agent.run_tool("bash", '{"command": "cat a/b.txt; exit 3"}', 5)
    assert out.startswith("exit code: 3") and "x = 2" in out


def test_tool_errors_are_results_not_crashes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("f.txt").write_text("aa aa\n")
    assert "occurs 2 times" in mini_agent.run_tool(
        "str_replace", '{"path": "f.txt", "old_str": "aa", "new_str": "b"}', 5
    )
    assert "not a file" in mini_agent.run_tool(
        "str_replace", '{"path": "nope", "old_str": "a", "new_str": "b"}', 5
    )
    assert "not valid JSON" in mini_agent.run_tool("bash", "{oops", 5)
    assert "missing argument" in mini_agent.run_tool("write_file", '{"path": "x"}', 5)
    assert "unknown tool" in mini_agent.run_tool("browse", "{}", 5)
    assert "timed out" in mini_agent.run_tool("bash", '{"command": "sleep 5"}', 0.2)


def test_long_output_is_clipped():
    out = mini_agent.run_tool("bash", '{"command": "head -c 100000 /dev/zero | tr \\"\\\\0\\" x"}', 5)
    assert len(out) < 20_000 and "characters cut" in out


def test_unreachable_api_exits_4_without_traceback(tmp_path):
    env = {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
        "OPENAI_API_KEY": "k",
        "PATH": "/usr/bin:/bin",
    }
    res = subprocess.run(
        [sys.executable, mini_agent.__file__, "--answer-file", str(tmp_path / "a.txt"), "do it"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 4 and "model API error" in res.stderr and "Traceback" not in res.stderr


def test_agent_speaks_plain_http_retries_5xx_and_imports_no_sdk(tmp_path):
    """The agent once imported the openai SDK: ~1.2 s of CPU per session, most of a learnable-task
    session. It now uses urllib; a 503 is retried as the SDK would, and the SDK is never loaded."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers["Authorization"], "body": body})
            if len(seen) == 1:
                self.send_response(503)
                self.end_headers()
                return
            answer = {
                "choices": [{"message": {"role": "assistant", "content": "DONE"}, "finish_reason": "stop"}]
            }
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    probe = (
        "import runpy, sys; sys.argv = sys.argv[1:]; "
        "code = 0\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print('SDK', 'openai' in sys.modules, file=sys.stderr); sys.exit(code)"
    )
    env = {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_port}/v1",
        "OPENAI_API_KEY": "tok",
        "PATH": "/usr/bin:/bin",
    }
    try:
        res = subprocess.run(
            [sys.executable, "-c", probe, mini_agent.__file__, "--model", "m", "--answer-file",
             str(tmp_path / "a.txt"), "say done"],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert res.returncode == 0, res.stderr
    assert "SDK False" in res.stderr
    assert (tmp_path / "a.txt").read_text() == "DONE"
    assert len(seen) == 2 and all(s["path"] == "/v1/chat/completions" for s in seen)
    assert seen[1]["auth"] == "Bearer tok" and seen[1]["body"]["model"] == "m"
    assert [t["function"]["name"] for t in seen[1]["body"]["tools"]] == ["bash", "write_file", "str_replace"]
