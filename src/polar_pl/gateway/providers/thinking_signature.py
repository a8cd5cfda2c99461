"""Thinking signatures made by the gateway: the reasoning text itself, compressed and base64-encoded.

Anthropic (`thinking.signature`, `redacted_thinking.data`) and Gemini (`thoughtSignature`) let a
client send a model turn back with its reasoning hidden or dropped, relying on an opaque
signature. The engine has no such state, so the gateway's signature carries the reasoning: a turn
sent back without its thinking text still re-renders with the exact reasoning the engine
produced, and the next prompt stays a token-prefix extension of the last one.
"""

from __future__ import annotations

import base64
import binascii
import zlib

_MAGIC = b"polar1:"


def encode_signature(reasoning: str) -> str:
    """Signature for reasoning the gateway returns (standard base64 alphabet)."""
    return base64.b64encode(_MAGIC + zlib.compress(reasoning.encode("utf-8"))).decode("ascii")


def decode_signature(signature: object) -> str | None:
    """The reasoning in a gateway-made signature, or None for any other value.

    Both base64 alphabets are accepted: the Python genai SDK re-encodes signature bytes URL-safe.
    """
    if not isinstance(signature, str) or not signature:
        return None
    try:
        raw = base64.b64decode(signature.replace("-", "+").replace("_", "/") + "==")
        if not raw.startswith(_MAGIC):
            return None
        return zlib.decompress(raw[len(_MAGIC) :]).decode("utf-8")
    except (binascii.Error, zlib.error, UnicodeDecodeError, ValueError):
        return None
