"""Refusing a prompt that cannot fit the engine's context before tokenizing all of it.

Token-faithful mode tokenizes every prompt in the gateway. A harness that sends a 10 MB prompt
would cost tens of seconds of gateway CPU and millions of token ids sent to an engine that then
refuses them. `check_fits` renders the prompt (cheap next to tokenizing it) and counts its tokens
piece by piece, stopping as soon as the count is past the context: what a prompt far too long
costs is about one context's worth of tokenizing.
"""

from __future__ import annotations

from typing import Any

from polar_pl.chat.render import render_marked

# A prompt's tokens are never more than its UTF-8 bytes (byte-level BPE) nor, below this many
# body bytes per context token, more than the context: such requests are not checked at all.
_UNCHECKED_BODY_SHARE = 4
# Tokenizing in pieces can count a few tokens more at each cut than tokenizing the whole.
_SLACK_PER_CUT = 8


class ContextTooLong(ValueError):
    """A prompt of at least `tokens` tokens for an engine whose context holds `limit`."""

    def __init__(self, tokens: int, limit: int, exact: bool = True):
        at_least = "" if exact else "at least "
        super().__init__(
            f"prompt is too long: {at_least}{tokens} tokens, and this model's maximum context length "
            f"is {limit} tokens (context_length_exceeded)"
        )
        self.tokens = tokens
        self.limit = limit


def needs_check(body_size: int, limit: int | None) -> bool:
    """Whether a request body of this size could hold a prompt longer than the context.
    A rendered prompt is at most about twice its request (templates indent tool schemas)."""
    return limit is not None and body_size * _UNCHECKED_BODY_SHARE > limit


def check_fits(tokenizer: Any, chat: dict[str, Any], limit: int) -> None:
    """Raises ContextTooLong if the rendered prompt of `chat` has `limit` tokens or more (the
    engine refuses a prompt that leaves no room to sample), tokenizing only as much as it takes."""
    text, _ = render_marked(
        tokenizer,
        chat.get("messages"),
        chat.get("tools"),
        chat_template_kwargs=chat.get("chat_template_kwargs"),
    )
    if len(text.encode()) < limit:  # a token is at least one byte
        return
    count, start, cuts = 0, 0, 0
    while start < len(text):
        end = min(len(text), start + limit)
        if end < len(text):  # cut at a line or a space: the cut then changes almost no token
            cut = max(text.rfind("\n", start, end), text.rfind(" ", start, end))
            end = cut if cut > start else end
            cuts += 1
        count += len(tokenizer.encode(text[start:end], add_special_tokens=False))
        if count >= limit + _SLACK_PER_CUT * cuts:
            raise ContextTooLong(count - _SLACK_PER_CUT * cuts, limit, exact=False)
        start = end
