"""Continuous batching for the transformers backend: one thread steps every active sequence
together, with a shared left-padded KV cache.

Each loop iteration:
1. applies a pending weight update (between steps, so no forward pass sees half-loaded weights);
2. admits waiting requests: prefill (chunked) each prompt but its last token, copy that KV n
   times for n choices, then merge every request admitted in this turn into the running batch
   in one copy of the batch cache; each new row's pending token is its prompt's last one;
3. runs ONE forward pass over all active sequences (B, 1) with the padded cache, samples a token
   per sequence (a new row's first) and hands each request its deltas;
4. drops finished or aborted sequences from the batch.

Shapes: the cache holds, per layer, keys/values (B, H_kv, T, D) where T is the longest context in
the batch; shorter rows are left-padded and masked by `mask` (B, T) (1 = real token). A row's next
position id is its real length, so padding never shifts RoPE positions.

Forward passes run on the engine's own forward (engine/decoder.py) where it covers the model, else
on transformers'; the own forward's packed weights are rebuilt whenever the policy version moves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from transformers import DynamicCache

from polar_pl.engine.backend import BackendStats, GenerationRequest, SeqDelta
from polar_pl.engine.constrain import ConstraintState
from polar_pl.engine.decoder import FastDecoder, unsupported
from polar_pl.engine.detok import SequenceOutput
from polar_pl.engine.kvcache import (
    KV,
    PrefixCache,
    batch_cache,
    cache_kv,
    cat_left_padded,
    empty_kv,
    with_cache,
)
from polar_pl.engine.sampling import make_generator, sample_batch

Sink = Callable[[list[SeqDelta] | BaseException | None], object]
T = TypeVar("T")


@dataclass(slots=True)
class _Seq:
    out: SequenceOutput
    generator: torch.Generator | None
    length: int  # real tokens in the cache + the pending last token
    last_token: int
    constraint: ConstraintState | None = None


@dataclass(slots=True)
class _Req:
    request: GenerationRequest
    sink: Sink
    seqs: list[_Seq] = field(default_factory=list)
    aborted: bool = False
    closed: bool = False  # the end-of-request sentinel was sent


@dataclass(slots=True)
class _Joining:
    """A request's rows, with the KV of its prompt but the last token (each row's pending one)."""

    req: _Req  # its rows: req.seqs
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, (len(req.seqs), H, length, D)
    length: int


class Scheduler:
    """Owns the model while running. Thread-safe entry points: submit, abort, run_exclusive, stop."""

    def __init__(
        self,
        model,
        tokenizer,
        eos_token_ids: tuple[int, ...],
        stats: BackendStats,
        *,
        max_batch_size: int = 64,
        prefill_chunk: int = 2048,
        version: Callable[[], int],
        num_threads: int | None = None,
        prefix_cache_bytes: int = 512 << 20,
        admit_check: Callable[[GenerationRequest], None] | None = None,
        fast_decoder: bool = True,
    ):
        self.model = model
        # the engine's own forward where it covers the model; /stats says why not otherwise
        off = unsupported(model) if fast_decoder else "turned off"
        self._fast = FastDecoder(model) if off is None else None
        self._fast_version = version()  # the policy version its packed weights were built at
        stats.extra["fast_decoder"] = off or "on"
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.num_threads = num_threads
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.stats = stats
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk
        self.version = version
        # raises for a request the backend no longer takes, checked on this thread after the
        # pushes queued before it ran (a stale adapter name)
        self.admit_check = admit_check
        self.device = next(model.parameters()).device
        self._cond = threading.Condition()
        self._waiting: list[_Req] = []
        self._exclusive: list[tuple[Callable[[], object], list]] = []
        self._running: list[_Req] = []
        self._seqs: list[tuple[_Req, _Seq]] = []  # batch rows, in cache order
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # (B, T)
        self._stop = False
        self._token_texts: list[str] | None = None  # for constrained decoding, built on first use
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)

    # -- thread-safe API ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def submit(self, request: GenerationRequest, sink: Sink) -> None:
        with self._cond:
            self._waiting.append(_Req(request, sink))
            self.stats.extra["waiting_requests"] = len(self._waiting)
            self._cond.notify_all()

    def abort(self, request_id: str) -> None:
        with self._cond:
            for req in self._waiting + self._running:
                if req.request.request_id == request_id:
                    req.aborted = True
            self._cond.notify_all()

    def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run fn on the scheduler thread between two steps (weight updates); returns its result."""
        if not self._thread.is_alive():
            return fn()
        slot: list = []
        done = threading.Event()

        def run() -> None:
            slot.append(_call(fn))
            done.set()

        with self._cond:
            self._exclusive.append((run, slot))
            self._cond.notify_all()
        done.wait()
        result = slot[0]
        if isinstance(result, BaseException):
            raise result
        return result

    # -- scheduler thread --------------------------------------------------------------------
    def _loop(self) -> None:
        if self.num_threads is not None:
            set_thread_local_num_threads(self.num_threads)
        self.stats.extra["num_threads"] = torch.get_num_threads()
        while True:
            with self._cond:
                while not (self._stop or self._waiting or self._exclusive or self._seqs):
                    self._cond.wait()
                if self._stop:
                    break
                exclusive, self._exclusive = self._exclusive, []
                room = self.max_batch_size - len(self._seqs)
                admit = []
                # A request wider than the whole batch still runs, alone.
                while self._waiting and (
                    room >= self._waiting[0].request.params.n or room == self.max_batch_size
                ):
                    req = self._waiting.pop(0)
                    room -= req.request.params.n
                    admit.append(req)
                self.stats.extra["waiting_requests"] = len(self._waiting)
            for fn, _ in exclusive:
                fn()
            with torch.inference_mode():
                joining: list[_Joining] = []
                for req in admit:
                    try:
                        if (j := self._admit(req)) is not None:
                            joining.append(j)
                    except Exception as exc:
                        req.closed = True
                        req.sink(exc)
                if joining:  # one copy of the batch cache for every request admitted this turn
                    try:
                        self._merge(joining)
                    except Exception as exc:  # the batch is as it was: only these requests fail
                        for j in joining:
                            j.req.closed = True
                            j.req.sink(exc)
                try:
                    if self._seqs:
                        self._decode_step()
                except Exception as exc:
                    self._fail_all(exc)
            self._retire()
        self._fail_all(RuntimeError("engine stopped"))

    def _admit(self, req: _Req) -> _Joining | None:
        """The request's rows, to merge into the batch, with the KV of its prompt but the last
        token: that token is each row's pending one, so the batch's next decode step computes the
        first token's logits with everyone else's instead of a forward pass of its own for every
        request (a group's attempts share their prompt, cached but for that token). None: aborted."""
        self.stats.requests += 1
        self._running.append(req)
        if req.aborted:
            return None
        if self.admit_check is not None:
            self.admit_check(req.request)
        prompt = list(req.request.prompt_ids)
        if not prompt:
            raise ValueError("empty prompt")
        params = req.request.params
        kv = self._prefill(req, prompt)
        if kv is None:
            return None
        n = params.n
        seqs = [
            _Seq(SequenceOutput(self.tokenizer, params, self.eos_token_ids, i),
                 make_generator(params, i, self.device), len(prompt), prompt[-1])
            for i in range(n)
        ]  # fmt: skip
        if params.tool_grammar is not None:
            for s in seqs:
                s.constraint = ConstraintState(params.tool_grammar, params.tool_grammar.initial())
        req.seqs = seqs
        kv = [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in kv]
        return _Joining(req, kv, len(prompt) - 1)

    def _prefill(self, req: _Req, prompt: list[int]) -> KV | None:
        """KV of the prompt but its last token: the longest cached prefix (never longer) is reused,
        the rest is computed in chunks. None: aborted (or stopping) between chunks."""
        context = prompt[:-1]
        cached, kv = self.prefix_cache.lookup(prompt)
        if cached < len(context):
            cache = DynamicCache(ddp_cache_data=kv) if kv is not None else DynamicCache()
            for start in range(cached, len(context), self.prefill_chunk):
                if req.aborted or self._stop:  # a long prefill gives way to an abort between chunks
                    return None
                chunk = torch.tensor([context[start : start + self.prefill_chunk]], device=self.device)
                positions = torch.arange(start, start + chunk.shape[1], device=self.device).unsqueeze(0)
                self._forward(chunk, positions, None, cache)
                self.stats.extra["prefill_forwards"] = self.stats.extra.get("prefill_forwards", 0) + 1
            kv = cache_kv(cache)
            self.prefix_cache.insert(context, kv)
        self.stats.extra.update(self.prefix_cache.stats())
        return kv if kv is not None else empty_kv(self.model)

    def _merge(self, joining: list[_Joining]) -> None:
        """Append the rows of newly admitted requests to the batch cache in one copy, left-padding
        every part to the longest."""
        t = max(j.length for j in joining)
        if self._cache is not None:
            assert self._mask is not None  # set together with _cache
            t = max(t, self._mask.shape[1])
            parts = [(cache_kv(self._cache), self._mask)]
        else:
            parts = []
        for j in joining:
            ones = torch.ones(len(j.req.seqs), j.length, dtype=torch.long, device=self.device)
            parts.append((j.kv, ones))
        per_layer = zip(*(kv for kv, _ in parts), strict=True)  # each layer's (k, v) of every part
        layers = [
            (cat_left_padded([k for k, _ in kvs], t), cat_left_padded([v for _, v in kvs], t))
            for kvs in per_layer
        ]
        self._cache = batch_cache(layers)
        self._mask = cat_left_padded([mask for _, mask in parts], t)
        for j in joining:
            self._seqs.extend((j.req, s) for s in j.req.seqs)

    def _decode_step(self) -> None:
        rows = self._seqs
        assert self._mask is not None  # rows in the batch
        b = len(rows)
        input_ids = torch.tensor([[s.last_token] for _, s in rows], device=self.device)  # (B, 1)
        positions = torch.tensor([[s.length - 1] for _, s in rows], device=self.device)  # (B, 1)
        mask = torch.cat([self._mask, torch.ones(b, 1, dtype=self._mask.dtype, device=self.device)], dim=1)
        assert self._cache is not None  # set together with _mask
        logits = self._forward(input_ids, positions, mask, self._cache)  # (B, V)
        self._mask = mask
        logits = self._constrain(logits, rows)
        tokens, lps = sample_batch(
            logits, [r.request.params for r, _ in rows], [s.generator for _, s in rows]
        )
        self.stats.steps += 1
        self.stats.tokens_generated += b
        self.stats.max_batch_size = max(self.stats.max_batch_size, b)
        if b > 1:
            self.stats.multi_seq_steps += 1
        touched: dict[int, _Req] = {}
        for (req, s), tok, lp in zip(rows, tokens, lps, strict=True):
            if req.aborted:
                s.out.abort()
            else:
                s.last_token = tok
                s.length += 1
                s.out.append(tok, lp)
                if s.constraint is not None:
                    assert self._token_texts is not None  # _constrain built it for this row
                    s.constraint.update(self._token_texts[tok])
            touched[id(req)] = req
        for req in touched.values():
            self._emit(req)

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: DynamicCache
    ) -> torch.Tensor:
        """Logits (B, V) of each row's last position; appends the new positions' KV to `cache`.
        input_ids, positions: (B, S); mask: (B, T) over the cache and the new positions, or None
        when no row is padded."""
        if self._fast is None:
            return self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                **with_cache(self.model, cache),
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1]
        if (version := self.version()) != self._fast_version:  # new weights since the last pack
            self._fast.refresh()
            self._fast_version = version
        return self._fast(input_ids, positions, mask, cache)

    def _constrain(self, logits: torch.Tensor, rows: list[tuple[_Req, _Seq]]) -> torch.Tensor:
        """(B, V) logits with tokens outside each constrained row's grammar at -inf. Logprobs are
        then those of the masked distribution, as vLLM's are under structured outputs."""
        constrained = [j for j, (_, s) in enumerate(rows) if s.constraint is not None]
        if not constrained:
            return logits
        vocab = logits.shape[-1]
        if self._token_texts is None:
            n_tok = len(self.tokenizer)
            self._token_texts = [
                self.tokenizer.decode([i], skip_special_tokens=False) if i < n_tok else ""
                for i in range(vocab)
            ]
        logits = logits.clone()
        for j in constrained:
            req, s = rows[j]
            assert s.constraint is not None  # a constrained row
            stops = set(self.eos_token_ids) | set(req.request.params.stop_token_ids)
            allowed = s.constraint.mask(self._token_texts, stops, vocab).to(logits.device)
            if bool(allowed.any()):
                logits[j] = logits[j].masked_fill(~allowed, float("-inf"))
        return logits

    def _emit(self, req: _Req) -> None:
        if req.closed:
            return
        version = self.version()
        deltas = [d for s in req.seqs if (d := s.out.take_delta(version)) is not None]
        if deltas:
            req.sink(deltas)
        if all(s.out.finished for s in req.seqs):
            req.closed = True
            req.sink(None)

    def _retire(self) -> None:
        """Close aborted requests, drop finished rows from the batch cache and trim padding that
        no remaining row needs."""
        for req in self._running:
            if req.aborted:
                for s in req.seqs:
                    s.out.abort()
                self._emit(req)
        self._running = [r for r in self._running if not r.closed]
        self.stats.extra["active_requests"] = len(self._running)
        keep = [i for i, (_, s) in enumerate(self._seqs) if not s.out.finished]
        self.stats.extra["active_sequences"] = len(keep)
        if len(keep) == len(self._seqs):
            return
        if not keep:
            self._seqs, self._cache, self._mask = [], None, None
            return
        assert self._cache is not None and self._mask is not None  # rows in the batch
        idx = torch.tensor(keep, device=self.device)
        mask = self._mask.index_select(0, idx)
        first_real = int((mask.cumsum(dim=1) == 0).sum(dim=1).min())  # padding shared by all rows
        layers = [
            (k.index_select(0, idx)[:, :, first_real:], v.index_select(0, idx)[:, :, first_real:])
            for k, v in cache_kv(self._cache)
        ]
        self._cache = batch_cache(layers)
        self._mask = mask[:, first_real:]
        self._seqs = [self._seqs[i] for i in keep]

    def _fail_all(self, exc: BaseException) -> None:
        with self._cond:
            reqs, self._waiting = self._running + self._waiting, []
        for req in reqs:
            req.sink(exc)
        self._running, self._seqs, self._cache, self._mask = [], [], None, None


def set_thread_local_num_threads(n: int) -> None:
    """Give the calling thread n torch intra-op threads without changing any other thread's.

    torch.set_num_threads sets the caller's OpenMP thread count, which is per thread, but also a
    process-wide default that threads apply when they first touch torch: in thread mode that would
    silently change the trainer's new threads. So the default is put back from a throwaway thread,
    whose own count dies with it.
    """
    default = torch.get_num_threads()  # on a fresh thread: the process-wide default
    torch.set_num_threads(n)
    restore = threading.Thread(target=torch.set_num_threads, args=(default,), name="num-threads-restore")
    restore.start()
    restore.join()


def _call(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:
        return exc
