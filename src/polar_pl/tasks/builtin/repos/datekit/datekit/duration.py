"""Human-readable durations: 3725 seconds <-> "1h 2m 5s"."""

import re

_UNITS = [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)]
_PART = re.compile(r"(\d+)([dhms])")


def format_duration(seconds):
    """Largest units first, zero units left out."""
    if seconds < 0:
        raise ValueError("negative duration")
    parts = []
    for name, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{name}")
    return " ".join(parts)


def parse_duration(text):
    """Inverse of format_duration: "1h 2m 5s" -> 3725."""
    text = text.strip()
    if not text or _PART.sub("", text).strip():
        raise ValueError(f"not a duration: {text!r}")
    sizes = dict(_UNITS)
    return sum(int(n) * sizes[u] for n, u in _PART.findall(text))
