"""The multi-turn check's warm start: its sessions are the ones the mini agent's note loop sends,
its answers follow the asked case with the configured share, and `polar-pl warm-start` refuses a
share out of range by its key."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from polar_pl.cli import main
from polar_pl.harness.mini_agent import run_notes
from polar_pl.tasks.answer import score_answer
from polar_pl.tasks.learnable import learnable_task
from polar_pl.warmstart.multiturn_warmstart import WORDS, case_session, session_messages


class Recorder:
    """An OpenAI-shaped client that records each request and answers from a script (the model is
    not under test here: the conversation the loop builds is)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.requests = list(replies), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, model: str, messages: list[dict], **kw) -> SimpleNamespace:
        self.requests.append([dict(m) for m in messages])
        message = SimpleNamespace(content=self.replies.pop(0))
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def test_sessions_are_the_conversation_the_note_loop_sends():
    """A warm start trained on another conversation than the one `run_notes` builds would teach
    the model a format it never sees at rollout time."""
    task = learnable_task("case", 0).prompt
    client = Recorder(["ok", "noted", "THE SKY"])
    _, answer = run_notes(task, "tiny", work_turns=2, extra={}, title=False, client=client)
    assert answer == "THE SKY"
    assert session_messages(task, ["ok", "noted"], answer) == [
        *client.requests[-1], {"role": "assistant", "content": "THE SKY"}
    ]  # fmt: skip


@pytest.mark.parametrize(("share", "expected"), [(1.0, 1.0), (0.0, 0.0)])
def test_answers_follow_the_asked_case_with_the_share(share, expected):
    rng = random.Random(3)
    for _ in range(20):
        messages = case_session(rng, share, work_turns=2)
        task, answer = messages[1]["content"], messages[-1]["content"]
        upper = task == task.upper()
        assert all(w.lower() in WORDS for w in answer.split())
        follows = [(w == w.upper()) == upper for w in answer.split()]
        assert sum(follows) / len(follows) == expected
        assert len(messages) == 7 and messages[3]["content"].startswith("Note 1 saved. The task: " + task)


def test_half_share_scores_like_a_prompt_blind_policy():
    """With share 0.5 the answers ignore the prompt: the mean reward is ~0.5 on both cases."""
    rng = random.Random(0)
    probes = {t.answer_check.kind: t for t in (learnable_task("case", 0), learnable_task("case", 1))}
    rewards = {kind: [] for kind in probes}
    for _ in range(400):
        messages = case_session(rng, 0.5, work_turns=1)
        task = messages[1]["content"]
        kind = "uppercase_fraction" if task == task.upper() else "lowercase_fraction"
        rewards[kind].append(score_answer(probes[kind], messages[-1]["content"]))
    for values in rewards.values():
        assert 0.4 < sum(values) / len(values) < 0.6


def test_cli_refuses_a_share_out_of_range_by_its_key(tmp_path, capsys):
    code = main(
        ["warm-start", "experiment=multiturn", f"model_dir={tmp_path / 'm'}", "warm_start.multiturn_case=1.5"]
    )
    assert code == 1 and "warm_start.multiturn_case must be in [0, 1], got 1.5" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
