"""The mini agent's note-taking loop through the real gateway: a title side call, then work turns
answered by observations, then the answer; the prefix builder merges the main calls into one row
whose observation tokens are masked, and keeps the title call a side row."""

from __future__ import annotations

import subprocess
import sys

from polar_pl.gateway.handle import Gateway
from polar_pl.harness import mini_agent
from polar_pl.testing.scripted import Reply, serve_scripted
from polar_pl.trajectory import PrefixBuilder


def test_notes_loop_is_one_merged_row_and_a_side_row(tiny_model_dir, tmp_path) -> None:
    with (
        serve_scripted(lambda chat: Reply("a note"), model_dir=tiny_model_dir) as engine,
        Gateway([engine.url], tmp_path / "t.db", tokenizer_dir=tiny_model_dir) as gw,
    ):
        s = gw.create_session(group_id="g", rollout_id="r")
        env = {"OPENAI_BASE_URL": f"{s.base_url}/v1", "OPENAI_API_KEY": s.token, "PATH": "/usr/bin:/bin"}
        res = subprocess.run(
            [sys.executable, mini_agent.__file__, "--model", "m", "--work-turns", "2", "--title",
             "--max-tokens", "6", "--answer-file", str(tmp_path / "a.txt"), "shout HELLO"],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        records = gw.records(s.session_id)
    assert res.returncode == 0, res.stderr
    assert [r.call_kind for r in records] == ["side", "main", "main", "main"]
    assert "side call: opencode_title" in records[0].notes
    last = records[-1].normalized_request["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "The task: shout HELLO Now give your final answer." in last[-1]["content"]
    built = PrefixBuilder().build(records, reward=1.0)
    side, main = sorted(built.rows, key=lambda r: r.meta["call_kind"] == "main")
    assert side.meta["call_kind"] == "side" and main.meta["num_calls"] == 3
    starts = [c["start"] for c in main.meta["calls"]]
    sampled = [len(r.response_ids) for r in records[1:]]
    assert sum(main.loss_mask) == sum(sampled) and len(starts) == 3
    for a, b, n in zip(starts, starts[1:], sampled, strict=False):  # observation turns in between
        assert b > a + n and not any(main.loss_mask[a + n : b])
    assert built.stats.breaks == {"side_call": 1}
