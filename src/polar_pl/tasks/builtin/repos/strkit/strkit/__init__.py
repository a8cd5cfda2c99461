"""strkit: small text helpers."""

from strkit.case import to_snake
from strkit.roman import from_roman, to_roman
from strkit.slug import slugify
from strkit.truncate import truncate
from strkit.wrap import wrap

__all__ = ["from_roman", "slugify", "to_roman", "to_snake", "truncate", "wrap"]
