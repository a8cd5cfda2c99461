"""The rollout service's JSON (`rollout/http/schema.py`): a group survives `group_json` -> bytes ->
`GroupOut` -> `group_from_json`, its attempts' `AttemptInfo` included, and `info` on the wire keeps
the shape older clients read (a dict of the scalar fields that are set)."""

from __future__ import annotations

from dataclasses import replace

import orjson

from polar_pl.rollout.http.schema import GroupOut, group_from_json, group_json
from polar_pl.rollout.pools import INFRA_FAILURE, OK, AttemptInfo, RolloutResult
from polar_pl.rollout.service import Group
from polar_pl.trajectory.rows import TrajectoryRow


def test_a_group_and_its_attempt_info_round_trip_through_the_wire():
    ran = AttemptInfo(
        harness="mini", exit_code=0, patch_bytes=12, answer="HELLO", eval_status="resolved",
        eval_reason="all tests pass", tests={"f2p_passed": 1, "f2p_total": 1}, session_id="s0",
        calls=2, merge={"merge/calls": 2.0}, worker="w0", node="n0", attempt=0,
    )  # fmt: skip
    lost = AttemptInfo(attempt=2, masked=True, cause="infra", infra_kind="worker")
    row = TrajectoryRow([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.25], [-1, 4, 4], "s0", "r0", "g0", 1.0)
    group = Group("g0", 3, "t", (
        RolloutResult("r0", "g0", "t", OK, 1.0, rows=(row,), timings={"init": 0.5}, info=ran),
        RolloutResult("r1", "g0", "t", INFRA_FAILURE, 0.0, error="lost", failed_stage="infra", info=lost),
    ))  # fmt: skip

    wire = orjson.loads(orjson.dumps(group_json(group)))
    ran_wire, lost_wire = (r["info"] for r in wire["results"])
    # scalars only, None and empty ones left out: the dicts tests and merge never went on the wire
    assert ran_wire == {
        "harness": "mini", "exit_code": 0, "patch_bytes": 12, "answer": "HELLO", "eval_status": "resolved",
        "eval_reason": "all tests pass", "session_id": "s0", "calls": 2, "masked": False,
        "worker": "w0", "node": "n0", "attempt": 0,
    }  # fmt: skip
    assert lost_wire == {"infra_kind": "worker", "masked": True, "attempt": 2, "cause": "infra", "calls": 0}

    back = group_from_json(GroupOut.model_validate(wire))
    assert back.results[0].info == replace(ran, tests={}, merge={})
    assert back.results[0].info.session_id == "s0" and back.results[0].info.eval_status == "resolved"
    assert back.results[1].info == lost
    assert [r.rows for r in back.results] == [(row,), ()] and back.results[0].timings == {"init": 0.5}


def test_info_keys_this_version_does_not_know_are_left_out():
    """A newer service may send keys an older trainer has no field for: they must not break it."""
    assert AttemptInfo.from_dict({"harness": "mini", "calls": 3, "partial": True}) == AttemptInfo(
        harness="mini", calls=3
    )
    assert AttemptInfo.from_dict({}) == AttemptInfo()
