"""Train from a plain PyTorch loop with polar_pl as the environment, over HTTP (no polar_pl import).

    polar-pl rollout serve --token secret experiment=tiny debug=fast &   # engine, gateway, harness, tasks
    python examples/train_with_rollout_service.py --token secret --model .cache/tiny-model

Each step: take finished groups (rows with the sampled-token mask and a reward per attempt), one
REINFORCE step with group-normalised advantages, save the weights, push them to the service.
"""

import argparse
import tempfile

import httpx
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--url", default="http://127.0.0.1:8100")
ap.add_argument("--token", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--groups", type=int, default=1)
ap.add_argument("--lr", type=float, default=1e-3)
a = ap.parse_args()

model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
api = httpx.Client(base_url=a.url, headers={"Authorization": f"Bearer {a.token}"}, timeout=900)

for step in range(a.steps):
    groups = api.get("/v1/groups", params={"n": a.groups, "timeout": 900}).raise_for_status().json()["groups"]
    terms, tokens, rewards = [], 0.0, []
    for group in groups:
        attempts = [r for r in group["results"] if r["rows"]]  # masked attempts carry no rows
        reward = torch.tensor([r["reward"] for r in attempts])
        rewards += reward.tolist()
        if len(attempts) < 2 or reward.std() == 0:
            continue  # no signal in this group
        advantage = (reward - reward.mean()) / (reward.std() + 1e-6)
        for adv, attempt in zip(advantage, attempts, strict=True):
            for row in attempt["rows"]:
                ids = torch.tensor([row["input_ids"]])
                sampled = torch.tensor(row["loss_mask"][1:], dtype=torch.float32)  # predicts token t+1
                logp = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
                terms.append(-(adv * logp * sampled).sum())
                tokens += float(sampled.sum())
    if terms:
        opt.zero_grad()
        (torch.stack(terms).sum() / max(tokens, 1.0)).backward()
        opt.step()
    with tempfile.TemporaryDirectory() as tmp:  # the service reads it before the call returns
        save_file(
            {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
            f"{tmp}/model.safetensors",
        )
        version = api.post("/v1/weights", json={"path": tmp}).raise_for_status().json()["policy_version"]
    mean = sum(rewards) / max(len(rewards), 1)
    print(
        f"step {step + 1}: {len(groups)} groups, reward {mean:.3f}, trained {len(terms)} rows, policy_version {version}"
    )
