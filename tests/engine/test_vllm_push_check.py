"""polar_pl's push to vLLM is checked on the trainer side before anything is sent (issue 58):
a state dict, a weights folder or an adapter with one bad tensor (wrong shape, not finite, not a
float) raises a ValueError naming it, and the server behind the handle receives no request. The
server here is a stand-in that answers vLLM's routes and records what it is sent (vLLM itself
does not check finiteness, and a reload that fails part-way leaves it half-loaded)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from polar_pl.engine.vllm_engine import VLLMEngine
from polar_pl.engine.weights import save_state_dict
from polar_pl.module.model import load_model


class _Handler(BaseHTTPRequestHandler):
    posts: list[str]

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer({"weight_version": "0"} if self.path == "/weight_info" else {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.posts.append(self.path)
        self._answer({})

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def vllm(tiny_model_dir) -> Iterator[tuple[VLLMEngine, list[str]]]:
    posts: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"posts": posts}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        yield VLLMEngine(tiny_model_dir, url=url, served_model_name="tiny").start(), posts
    finally:
        server.shutdown()
        thread.join()


def state(tiny_model_dir) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_model(tiny_model_dir).state_dict().items()}


def test_a_bad_state_dict_or_folder_is_refused_before_anything_is_sent(vllm, tiny_model_dir, tmp_path):
    engine, posts = vllm
    for name, bad in (
        ("model.norm.weight", torch.zeros(3, 3)),
        ("model.layers.1.mlp.up_proj.weight", torch.full((384, 128), torch.inf)),
        ("model.embed_tokens.weight", torch.ones(8192, 128, dtype=torch.int32)),
        ("model.layers.9.mlp.up_proj.weight", torch.zeros(384, 128)),  # no such layer
    ):
        with pytest.raises(ValueError, match=name):
            engine.update_weights_from_state_dict({**state(tiny_model_dir), name: bad})
        assert posts == [] and engine.policy_version() == 0
    folder = tmp_path / "bad"
    save_state_dict({**state(tiny_model_dir), "model.norm.weight": torch.full((128,), torch.nan)}, folder)
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.update_weights_from_disk(str(folder))
    assert posts == []
    # good pushes (the tied head named too, as the trainer's state dict names it) go through
    assert engine.update_weights_from_state_dict(state(tiny_model_dir)) == 1
    assert "/collective_rpc" in posts
    save_state_dict(state(tiny_model_dir), tmp_path / "good")
    assert engine.update_weights_from_disk(str(tmp_path / "good")) == 2


def test_a_bad_adapter_is_refused_before_anything_is_sent(vllm, tiny_model_dir):
    engine, posts = vllm
    module = "base_model.model.model.layers.0.self_attn.q_proj"
    good = {f"{module}.lora_A.weight": torch.zeros(4, 128), f"{module}.lora_B.weight": torch.zeros(128, 4)}
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    for name, bad in (
        (f"{module}.lora_B.weight", torch.full((128, 4), torch.nan)),
        (f"{module}.lora_B.weight", torch.zeros(64, 4)),  # B @ A does not fit q_proj (128, 128)
        (f"{module}.lora_A.weight", torch.zeros(4, 128, dtype=torch.int64)),
    ):
        with pytest.raises(ValueError, match=name.rsplit(".", 2)[0]):
            engine.update_adapter({**good, name: bad}, config)
        assert posts == [] and engine.policy_version() == 0
    assert engine.update_adapter(good, config) == 1 and engine.model == "tiny-lora-v1"
