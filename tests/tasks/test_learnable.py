"""The learnable family: real answer checks, varied rewards for the untrained tiny model's samples
(so GRPO groups carry signal), and a short GRPO loop that measurably raises the reward."""

from __future__ import annotations

import statistics

import pytest

from polar_pl.tasks.answer import AnswerEvaluator, charset_fraction, similarity, uppercase_fraction
from polar_pl.tasks.learnable import LearnableTaskSource, learnable_task


def test_checks_read_the_answer():
    assert uppercase_fraction("HELLO THERE", {}) == 1.0
    assert uppercase_fraction("Hello there", {}) == pytest.approx(1 / 10)
    assert uppercase_fraction("1234 !!", {}) == 0.0
    assert uppercase_fraction("OK", {"min_letters": 8}) == pytest.approx(2 / 8)
    assert charset_fraction("12a4 5", {"chars": "0123456789"}) == pytest.approx(4 / 5)
    assert similarity(" banana\n", {"target": "banana"}) == 1.0
    assert similarity("bandana", {"target": "banana"}) == pytest.approx(2 * 6 / 13)
    assert similarity("", {"target": "banana"}) == 0.0


def test_answer_evaluator_results():
    source = LearnableTaskSource(n_tasks=3)
    (task, *_) = source.tasks()
    ev = source.make_evaluator(None)
    assert isinstance(ev, AnswerEvaluator)
    shout = ev.evaluate(ev.prewarm(task), "", "THE WEATHER IS GREAT TODAY")
    assert (shout.status, shout.reward) == ("resolved", 1.0)
    mixed = ev.evaluate(ev.prewarm(task), "", "The weather is GREAT")
    assert mixed.status == "unresolved" and mixed.reward == pytest.approx(6 / 17)
    none = ev.evaluate(ev.prewarm(task), "", None)
    assert (none.status, none.reward) == ("no_answer", 0.0)


def _new_file_patch(path: str, content: str) -> str:
    lines = content.splitlines() or [""]
    body = "".join(f"+{ln}\n" for ln in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..1111111\n"
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def test_file_kind_is_scored_from_the_workspace_not_the_answer():
    """Real CLIs write the answer file with their own tools; the final message does not count."""
    task = learnable_task("file", 0)
    word = task.answer_check.params["target"]
    assert word.isupper() and f"the word {word}" in task.prompt
    ev = AnswerEvaluator()
    exact = ev.evaluate(ev.prewarm(task), _new_file_patch("answer.txt", word + "\n"), answer=None)
    assert exact.reward == 1.0 and exact.status == "resolved"
    lower = ev.evaluate(ev.prewarm(task), _new_file_patch("answer.txt", word.lower()), answer=word)
    assert lower.reward == 0.5  # the right word in the wrong case
    elsewhere = ev.evaluate(ev.prewarm(task), _new_file_patch("notes.txt", word), answer=word)
    assert elsewhere.reward == 0.0  # the right word in the answer or another file scores nothing


def test_family_is_deterministic_and_varied():
    a = LearnableTaskSource(n_tasks=8, seed=3).tasks()
    b = LearnableTaskSource(n_tasks=8, seed=3).tasks()
    assert a == b and len({t.prompt for t in a}) >= 4
    assert all(
        "capital" in t.prompt.lower() or "caps" in t.prompt.lower() or "uppercase" in t.prompt.lower()
        for t in a
    )
    assert learnable_task("echo", 0).answer_check.kind == "similarity"
    with pytest.raises(ValueError, match="task.kind"):
        LearnableTaskSource(kind="telepathy")


def _sample(model, tokenizer, prompt: str, n: int, max_new_tokens: int, seed: int) -> list[str]:
    import torch

    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
            num_return_sequences=n, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    prompt_len = enc["input_ids"].shape[1]
    return [tokenizer.decode(o[prompt_len:], skip_special_tokens=True) for o in out]


@pytest.fixture
def one_thread():
    """The tiny model is faster on one thread than fighting other test processes for all cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _load(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_untrained_model_rewards_vary(tiny_model_dir, one_thread):
    tokenizer, model = _load(tiny_model_dir)
    source = LearnableTaskSource(n_tasks=2)
    ev = source.make_evaluator(None)
    for task in source.tasks():
        answers = _sample(model, tokenizer, task.prompt, n=16, max_new_tokens=32, seed=0)
        rewards = [ev.evaluate(ev.prewarm(task), "", a).reward for a in answers]
        assert len(set(rewards)) >= 8, rewards  # a GRPO group of 16 is far from constant
        assert statistics.pstdev(rewards) > 0.03, rewards
        assert 0.02 < statistics.mean(rewards) < 0.5, rewards  # non-zero, with room to improve


@pytest.mark.slow
def test_grpo_raises_reward_within_30_steps(tiny_model_dir, one_thread):
    """Plain GRPO (group-normalised advantages, sequence-mean log-likelihood) straight on the
    model: the learnable family's reward must clearly rise in 30 CPU steps."""
    import torch

    tokenizer, model = _load(tiny_model_dir)
    (task,) = LearnableTaskSource(n_tasks=1).tasks()
    ev = AnswerEvaluator()
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": task.prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    prompt_len = enc["input_ids"].shape[1]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    means = []
    for _ in range(30):
        model.eval()
        with torch.no_grad():
            seqs = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=32,
                                  num_return_sequences=16, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        resp = seqs[:, prompt_len:]
        texts = [tokenizer.decode(r, skip_special_tokens=True) for r in resp]
        rewards = torch.tensor([ev.evaluate(ev.prewarm(task), "", t).reward for t in texts])
        means.append(rewards.mean().item())
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        model.train()
        logp = torch.log_softmax(model(seqs).logits[:, prompt_len - 1 : -1].float(), -1)
        logp = logp.gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        mask = (resp != tokenizer.pad_token_id).float()
        loss = -((logp * mask).sum(1) / mask.sum(1).clamp(min=1) * adv).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    first, last = statistics.mean(means[:5]), statistics.mean(means[-5:])
    print("reward by step:", [round(m, 3) for m in means])
    assert last > first + 0.25, means
