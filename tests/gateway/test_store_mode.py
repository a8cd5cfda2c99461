"""The trace store holds every prompt and answer of every session: it is created readable by its
owner only, as the admin token file is, and SQLite's WAL files beside it follow its mode."""

from __future__ import annotations

import os
import stat

import openai

from polar_pl.gateway.handle import Gateway


def test_a_new_store_and_its_wal_files_are_0600(engine, tmp_path):
    """It was created 0644 (world-readable) under the usual umask 022."""
    old = os.umask(0o022)
    try:
        with Gateway([engine.url], tmp_path / "traces.db", token_faithful=False) as gw:
            s = gw.create_session()
            client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            modes = {
                p.name: stat.S_IMODE(p.stat().st_mode)
                for p in tmp_path.iterdir()
                if p.name.startswith("traces")
            }
    finally:
        os.umask(old)
    assert set(modes) == {"traces.db", "traces.db-wal", "traces.db-shm"}, modes
    assert set(modes.values()) == {0o600}, modes
