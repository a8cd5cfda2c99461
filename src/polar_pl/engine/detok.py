"""Per-sequence output processing shared by every backend: incremental detokenization, EOS and
stop-token handling, stop strings and max_tokens — with vLLM's semantics, so the text and finish
reasons match the reference engine token for token.

- EOS / stop token ids end the sequence with finish "stop"; the token stays in `token_ids` but adds
  no text. stop_reason is None for EOS, the id for a stop token id.
- A stop string cuts the text before it (after it with include_stop_str_in_output); stop_reason is
  the string. The token ids are not cut.
- While stop strings are set, the last len(longest stop)-1 characters are held back from streamed
  deltas, because they could still turn out to be the start of a stop string.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from polar_pl.engine.backend import SamplingParams, SeqDelta, TokenLogprob


class SequenceOutput:
    """Tracks one choice's generated tokens and text."""

    def __init__(self, tokenizer, params: SamplingParams, eos_token_ids: tuple[int, ...], index: int = 0):
        self.index = index
        self.params = params
        self._rust_tokenizer = tokenizer._tokenizer
        self._stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)
        self._eos = set() if params.ignore_eos else set(eos_token_ids)
        self._stop_ids = set(params.stop_token_ids)
        self._holdback = (
            max((len(s) for s in params.stop), default=1) - 1 if not params.include_stop_str_in_output else 0
        )
        self.token_ids: list[int] = []
        self.text = ""
        self._sent = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self._pending_ids: list[int] = []
        self._pending_lps: list[TokenLogprob] = []
        self._final_sent = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token_id: int, logprob: TokenLogprob | None = None) -> None:
        """Add one sampled token; sets finish_reason when the sequence is done."""
        assert not self.finished, "token appended to a finished sequence"
        self.token_ids.append(token_id)
        self._pending_ids.append(token_id)
        if logprob is not None:
            self._pending_lps.append(logprob)
        if token_id in self._eos or token_id in self._stop_ids:
            self.finish_reason = "stop"
            self.stop_reason = None if token_id in self._eos else token_id
            return
        before = len(self.text)
        chunk = self._stream.step(self._rust_tokenizer, token_id)
        if chunk:
            self.text += chunk
            self._check_stop_strings(before)
        if not self.finished and len(self.token_ids) >= self.params.max_tokens:
            self.finish_reason = "length"

    def abort(self) -> None:
        if not self.finished:
            self.finish_reason = "abort"

    def _check_stop_strings(self, new_from: int) -> None:
        for stop in self.params.stop:
            # A stop string may straddle the previous text and the new chunk.
            idx = self.text.find(stop, max(0, new_from - len(stop) + 1))
            if idx != -1:
                end = idx + len(stop) if self.params.include_stop_str_in_output else idx
                self.text = self.text[:end]
                self.finish_reason = "stop"
                self.stop_reason = stop
                return

    def take_delta(self, policy_version: int = 0) -> SeqDelta | None:
        """The tokens and text not yet handed out, or None if nothing changed."""
        if self._final_sent or (not self._pending_ids and not self.finished):
            return None
        self._final_sent = self.finished
        limit = len(self.text) if self.finished else max(self._sent, len(self.text) - self._holdback)
        text = self.text[self._sent : limit]
        self._sent = limit
        delta = SeqDelta(
            index=self.index,
            token_ids=tuple(self._pending_ids),
            text=text,
            logprobs=tuple(self._pending_lps) if self.params.logprobs is not None else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            policy_version=policy_version,
        )
        self._pending_ids = []
        self._pending_lps = []
        return delta
