"""The SFT run log: what makes an interrupted generation resume without losing or repeating a group."""

from __future__ import annotations

import json

import pytest

from polar_pl.sft.log import RolloutLog

FP = {"tasks": "3:abc", "group_size": 2, "threshold": 1.0, "merge": "prefix", "harness": "mini"}


def group(seq: int, accepted: bool = True) -> dict:
    reason = "accepted" if accepted else "below_threshold"
    return {"seq": seq, "task_id": f"t{seq}", "attempts": [{"rollout_id": f"g{seq}-r0", "reason": reason}]}


def test_groups_survive_a_reopen_and_the_cursor_skips_them(tmp_path):
    log = RolloutLog(tmp_path, FP)
    for seq in (0, 1, 3):
        log.append(group(seq))
    again = RolloutLog(tmp_path, FP)
    assert again.done == {0, 1, 3}
    assert again.cursor() == {"start_seq": 2, "skip_seqs": [3]}
    state = json.loads((tmp_path / "run_state.json").read_text())
    assert state["cursor"] == again.cursor() and state["fingerprint"] == FP


def test_a_line_torn_by_a_kill_is_cut_and_its_group_runs_again(tmp_path):
    """A kill in the middle of a write leaves half a line; it must not hide or corrupt the rest."""
    log = RolloutLog(tmp_path, FP)
    log.append(group(0))
    with open(tmp_path / "rollouts.jsonl", "a") as f:
        f.write('{"seq": 1, "task_id": "t1", "attem')
    again = RolloutLog(tmp_path, FP)
    assert again.done == {0}
    assert (tmp_path / "rollouts.jsonl").read_text().endswith("}\n")
    again.append(group(1))
    lines = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1]


def test_a_group_already_logged_is_not_written_twice(tmp_path):
    log = RolloutLog(tmp_path, FP)
    log.append(group(0))
    log.append(group(0, accepted=False))
    assert len((tmp_path / "rollouts.jsonl").read_text().splitlines()) == 1
    assert [a["reason"] for a in log.attempts()] == ["accepted"]


def test_resuming_under_other_settings_is_refused_by_name(tmp_path):
    RolloutLog(tmp_path, FP).append(group(0))
    with pytest.raises(ValueError, match=r"group_size=2, this run has 4.*sft.resume=false"):
        RolloutLog(tmp_path, {**FP, "group_size": 4})
    fresh = RolloutLog(tmp_path, {**FP, "group_size": 4}, resume=False)
    assert fresh.done == set() and not (tmp_path / "rollouts.jsonl").exists()


def test_stats_keep_infrastructure_failures_apart(tmp_path):
    """An attempt the infrastructure lost is not a rejected model attempt: it is counted by kind and
    left out of the acceptance rate and the mean reward."""
    from polar_pl.sft.export import compute_stats

    def attempt(i, status, reason, reward, kind=None):
        info = {"infra_kind": kind} if kind else {}
        return {"rollout_id": f"g0-r{i}", "task_id": "t0", "status": status, "reason": reason,
                "reward": reward, "info": info}  # fmt: skip

    log = RolloutLog(tmp_path, FP)
    log.append({"seq": 0, "task_id": "t0", "attempts": [
        attempt(0, "ok", "accepted", 1.0), attempt(1, "failed", "failed", 0.0),
        attempt(2, "infra_failure", "infra_failure", 0.0, "image"),
        attempt(3, "infra_failure", "infra_failure", 0.0, "exec"),
    ]})  # fmt: skip
    stats = compute_stats(log, [], [], num_groups=1)
    assert stats["attempts"] == 2 and stats["acceptance_rate"] == 0.5 and stats["mean_reward"] == 0.5
    assert stats["infra_failures"] == {"exec": 1, "image": 1} and stats["rejected"] == {"failed": 1}
