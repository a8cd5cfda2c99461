"""ScriptedBackend: a test double for the components AROUND the engine (gateway, harness runs,
trainer plumbing). It serves the real engine HTTP contract (same server code as the real model)
but answers each request with the next scripted assistant turn.

A turn is text and/or tool calls given as data (`Reply`), a plain string, or a callable that gets
the validated chat body (a dict: messages, tools, ...) and returns one of those. The turn is
rendered the way the model's chat template writes an assistant turn (hermes `<tool_call>` JSON,
closed by the EOS token), tokenized by the real tokenizer, and streamed token by token with
deterministic logprobs, so token ids, tool-call parsing, finish reasons and usage are all real.

Example — the agent calls `write_file`, gets the tool result, then says "done":

    from polar_pl.testing.scripted import Reply, ToolCall, serve_scripted

    script = [
        Reply(tool_calls=[ToolCall("write_file", {"path": "a.txt", "content": "hi"})]),
        Reply("done"),
    ]
    with serve_scripted(script, model_dir=tiny_model_dir) as engine:
        client = openai.OpenAI(base_url=engine.base_url, api_key="x")
        r = client.chat.completions.create(model=engine.model, messages=[...], tools=[...])
        assert r.choices[0].finish_reason == "tool_calls"
        # ... append the assistant turn and a {"role": "tool", ...} result, call again -> "done"
        engine.backend.requests  # every GenerationRequest received, with its chat body
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from polar_pl.chat.toolparse import render_tool_call
from polar_pl.engine.backend import BackendStats, GenerationRequest, SeqDelta, TokenLogprob
from polar_pl.engine.detok import SequenceOutput
from polar_pl.engine.errors import EngineError


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted assistant turn. `content` comes before the tool calls, as the model writes it.
    reasoning: if set, the turn opens with the template's thinking block (`<think>...</think>`).
    end_with_eos=False leaves the turn open (the request then ends by max_tokens: "length")."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] | list[ToolCall] = ()
    reasoning: str | None = None
    end_with_eos: bool = True


ScriptItem = Reply | str | Callable[[dict[str, Any]], Reply | str]


def default_model_dir() -> Path:
    return Path(os.environ.get("POLAR_TINY_MODEL", Path.cwd() / ".cache" / "tiny-model"))


class ScriptedBackend:
    """GenerationBackend answering from a script (see module docstring).

    script: a list of items consumed one per choice (so n=2 consumes two), or a single callable
        used for every choice. Running out of script answers 500 with a clear message.
    token_delay: seconds between streamed tokens (to exercise timeouts and concurrency).
    `abandoned` holds the time.monotonic() at which each generation stopped before its reply
    ended (the engine request was aborted), so a test can tell when its caller let it go.
    """

    def __init__(
        self,
        tokenizer,
        script: Iterable[ScriptItem] | Callable[[dict[str, Any]], Reply | str],
        *,
        model_name: str = "scripted",
        max_model_len: int = 32768,
        token_delay: float = 0.0,
        eos_token_ids: tuple[int, ...] | None = None,
    ):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.token_delay = token_delay
        eos = eos_token_ids or tuple(
            i
            for i in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id)
            if i is not None
        )
        self.eos_token_ids = tuple(dict.fromkeys(eos))
        self.default_stop_token_ids: tuple[int, ...] = ()
        self.policy_version = 0
        self.stats = BackendStats()
        self.requests: list[GenerationRequest] = []
        self.abandoned: list[float] = []
        self._lock = threading.Lock()
        if callable(script):
            self._items: Iterator[ScriptItem] = itertools.repeat(script)
        else:
            self._items = iter(list(script))

    @classmethod
    def from_model_dir(cls, model_dir: str | os.PathLike, script, **kwargs) -> ScriptedBackend:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)), script, **kwargs)

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def update_weights_from_state_dict(self, state_dict) -> int:
        with self._lock:
            self.policy_version += 1
            return self.policy_version

    def update_weights_from_disk(self, path: str) -> int:
        if not Path(path).is_dir():
            raise FileNotFoundError(path)
        return self.update_weights_from_state_dict({})

    def render_reply(self, reply: Reply | str, chat: Mapping[str, Any] | None) -> list[int]:
        """Token ids of an assistant turn, written as the chat template writes assistant turns."""
        if isinstance(reply, str):
            reply = Reply(reply)
        text = _assistant_text(self.tokenizer, reply)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        cut = next((i for i, t in enumerate(ids) if t in self.eos_token_ids), None)
        if reply.end_with_eos:
            ids = ids[: cut + 1] if cut is not None else ids + [self.eos_token_ids[0]]
        elif cut is not None:
            ids = ids[:cut]
        return ids

    def _next_reply(self, chat: dict[str, Any]) -> Reply | str:
        with self._lock:
            item = next(self._items, None)
        if item is None:
            raise EngineError("scripted engine: the script has no reply left for this request", 500)
        return item(chat) if callable(item) else item

    async def generate(self, request: GenerationRequest) -> AsyncIterator[list[SeqDelta]]:
        self.requests.append(request)
        self.stats.requests += 1
        chat = dict(request.chat or {})
        replies = [self.render_reply(self._next_reply(chat), chat) for _ in range(request.params.n)]
        outs = [
            SequenceOutput(self.tokenizer, request.params, self.eos_token_ids, i) for i in range(len(replies))
        ]
        vocab = len(self.tokenizer)
        try:
            for step in itertools.count():
                live = [(o, r) for o, r in zip(outs, replies, strict=True) if not o.finished]
                if not live:
                    return
                batch = []
                for out, ids in live:
                    if step >= len(ids):  # an open turn ran out: stop as if by length
                        out.finish_reason = "length"
                    else:
                        out.append(ids[step], _logprob(ids[step], step, vocab))
                    if (d := out.take_delta(self.policy_version)) is not None:
                        batch.append(d)
                self.stats.steps += 1
                self.stats.tokens_generated += len(live)
                self.stats.max_batch_size = max(self.stats.max_batch_size, len(live))
                if batch:
                    yield batch
                await asyncio.sleep(self.token_delay)
        finally:
            if not all(o.finished for o in outs):
                self.abandoned.append(time.monotonic())


def _logprob(token_id: int, step: int, vocab: int) -> TokenLogprob:
    """Deterministic, plausible logprobs: the sampled token is always the most likely."""
    lp = -0.05 * (1 + step % 7)
    top = ((token_id, lp),) + tuple(((token_id + j) % vocab, lp - 1.5 * j) for j in range(1, 6))
    return TokenLogprob(token_id, lp, top)


def _assistant_text(tokenizer, reply: Reply) -> str:
    """Render the turn with the chat template and keep what follows the generation prompt (the
    caller cuts at the first EOS). Without reasoning the turn is rendered as a history turn (a user
    message follows), so Qwen3-style templates add no empty thinking block. Falls back to the
    hermes convention if the template does not extend its own generation prompt."""
    calls = [
        {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
        for c in reply.tool_calls
    ]
    user = [{"role": "user", "content": "."}]
    assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if calls:
        assistant["tool_calls"] = calls
    after = []
    if reply.reasoning is not None:
        assistant["reasoning_content"] = reply.reasoning
    else:
        after = user
    try:
        prefix = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(user + [assistant] + after, tokenize=False)
        if full.startswith(prefix):
            return full[len(prefix) :]
    except (TemplateError, TypeError, ValueError):
        pass  # a template without tool support: write the hermes text directly
    parts = [reply.content] if reply.content else []
    parts += [render_tool_call(c.name, dict(c.arguments)) for c in reply.tool_calls]
    return "\n".join(parts) + (tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) or "")


class ScriptedServer:
    """A ScriptedBackend served over HTTP on 127.0.0.1; also an `Engine` handle
    (`polar_pl.engine.protocol`), so code that drives a real engine can drive this one."""

    def __init__(self, backend: ScriptedBackend, *, port: int | None = None):
        from polar_pl.engine.server import create_app
        from polar_pl.utils.serving import ServerThread

        self.backend = backend
        self._thread = ServerThread(create_app(backend), port=port)

    @property
    def url(self) -> str:
        return self._thread.url

    @property
    def base_url(self) -> str:
        """The OpenAI SDK base URL (ends with /v1)."""
        return f"{self.url}/v1"

    @property
    def urls(self) -> list[str]:
        return [self.url]

    @property
    def model_dir(self) -> Path | None:
        return None  # a script, no weights: gateways in front of it render prompts themselves

    @property
    def model(self) -> str:
        return self.backend.model_name

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()

    def health(self) -> bool:
        from polar_pl.engine.process import healthy

        return healthy(self.url)

    def policy_version(self) -> int:
        return self.backend.policy_version

    def update_weights_from_state_dict(self, state_dict) -> int:
        return self.backend.update_weights_from_state_dict(state_dict)

    def update_weights_from_disk(self, path: str) -> int:
        return self.backend.update_weights_from_disk(path)


@contextmanager
def serve_scripted(
    script, model_dir: str | os.PathLike | None = None, *, port: int | None = None, **kwargs
) -> Iterator[ScriptedServer]:
    """Serve a ScriptedBackend over real HTTP on 127.0.0.1 for the duration of the block."""
    backend = ScriptedBackend.from_model_dir(model_dir or default_model_dir(), script, **kwargs)
    server = ScriptedServer(backend, port=port).start()
    try:
        yield server
    finally:
        server.stop()
