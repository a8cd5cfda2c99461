"""URL slugs."""

import re
import unicodedata

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(text, sep="-"):
    """Lowercase ASCII slug: runs of other characters become one separator."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return _NON_ALNUM.sub(sep, text.lower())
