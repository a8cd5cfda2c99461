"""Engine threads: `num_threads` governs the engine's scheduler thread only.

Failure this guards against: in thread mode the engine called torch.set_num_threads from the
trainer's thread at construction, silently changing the trainer's intra-op threads.
"""

from __future__ import annotations

import threading

import httpx
import torch

from polar_pl.engine.embedded import EmbeddedEngine


def in_a_new_thread() -> int:
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


def test_num_threads_leaves_the_callers_torch_threads_alone(tiny_model_dir):
    before = torch.get_num_threads()
    # (what a new thread starts with may differ from this thread's count after earlier tests set it)
    new_thread_before = in_a_new_thread()
    engine_threads = 1 if before > 1 else 2
    with EmbeddedEngine(tiny_model_dir, served_model_name="tiny", num_threads=engine_threads) as eng:
        r = httpx.post(
            f"{eng.base_url}/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        stats = httpx.get(f"{eng.url}/stats", timeout=10).json()
        assert stats["num_threads"] == engine_threads  # what the forward passes ran with
        assert torch.get_num_threads() == before  # the caller (a trainer) is untouched
        assert in_a_new_thread() == new_thread_before  # nor any other thread of the process
