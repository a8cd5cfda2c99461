"""Tokenizer: numbers, names, operators and parentheses."""

from calc.errors import CalcError

OPERATORS = "+-*/^()"


def tokenize(text):
    """Return a list of (kind, value) with kind in {"num", "name", "op"}."""
    tokens = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit():
            j = i
            while j < len(text) and (text[j].isdigit() or text[j] == "."):
                j += 1
            tokens.append(("num", _number(text[i:j])))
            i = j
        elif ch.isalpha() or ch == "_":
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            tokens.append(("name", text[i:j]))
            i = j
        elif ch in OPERATORS:
            tokens.append(("op", ch))
            i += 1
        else:
            raise CalcError(f"unexpected character {ch!r} at position {i}")
    return tokens


def _number(s):
    try:
        return float(s) if "." in s else int(s)
    except ValueError:
        raise CalcError(f"malformed number {s!r}") from None
