"""Shortening text for display."""


def truncate(text, limit, ellipsis="..."):
    """Return text unchanged if it fits in `limit` characters, else a shortened copy ending in
    `ellipsis`."""
    if len(text) <= limit:
        return text
    return text[:limit] + ellipsis
