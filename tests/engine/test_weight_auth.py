"""The engine's weight route: anyone who reached it could replace the policy (a sandboxed agent on
the host network could POST /update_weights_from_disk). It needs the admin token, checked before the
body is read, and is off when the engine has none."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.server import create_app
from polar_pl.testing.scripted import ScriptedBackend
from polar_pl.utils import tokens
from polar_pl.utils.serving import ServerThread

TOKEN = "engine-admin-token-for-tests"


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return ScriptedBackend.from_model_dir(tiny_model_dir, lambda chat: "ok")


def _post(url: str, path: str, token: str | None, body: bytes | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    content = body if body is not None else httpx.Request("POST", url, json={"path": path}).content
    return httpx.post(f"{url}/update_weights_from_disk", content=content, headers=headers, timeout=30)


def test_weight_route_needs_the_admin_token(backend, tmp_path):
    with ServerThread(create_app(backend, admin_token=TOKEN)) as srv:
        v0 = backend.policy_version
        for token in (None, "guess", TOKEN + "x"):
            r = _post(srv.url, str(tmp_path), token)
            assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError", r.text
        assert _post(srv.url, str(tmp_path), None, body=b"not json").status_code == 401  # auth first
        assert backend.policy_version == v0
        r = _post(srv.url, str(tmp_path), TOKEN)
        assert r.status_code == 200 and r.json()["policy_version"] == v0 + 1
        assert _post(srv.url, str(tmp_path), TOKEN, body=b"not json").status_code == 400


def test_weight_route_is_off_without_a_token(backend, tmp_path):
    with ServerThread(create_app(backend)) as srv:
        v0 = backend.policy_version
        r = _post(srv.url, str(tmp_path), TOKEN)
        assert r.status_code == 403 and "weight updates are off" in r.json()["error"]["message"]
        assert backend.policy_version == v0


@pytest.mark.slow
def test_subprocess_engine_token_stays_off_its_command_line(tiny_model_dir, tmp_path):
    """EmbeddedEngine(mode="subprocess") hands the child `polar-pl engine` its token through the
    environment: /proc/<pid>/cmdline is readable by every process on the host."""
    with EmbeddedEngine(tiny_model_dir, mode="subprocess", num_threads=1) as engine:
        assert engine.admin_token.encode() not in Path(f"/proc/{engine._proc.proc.pid}/cmdline").read_bytes()
        assert _post(engine.url, str(tiny_model_dir), "guess").status_code == 401
        v0 = engine.policy_version()
        assert engine.update_weights_from_disk(str(tiny_model_dir)) == v0 + 1


def test_admin_token_from_a_file_or_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "token"
    monkeypatch.delenv(tokens.ENV, raising=False)
    assert tokens.admin_token(None) is None
    monkeypatch.setenv(tokens.ENV, "from-env")
    assert tokens.admin_token(None) == "from-env"
    made = tokens.admin_token(path, create=True)
    assert len(made) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert tokens.admin_token(path) == made == tokens.admin_token(path, create=True)
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        tokens.admin_token(path)
