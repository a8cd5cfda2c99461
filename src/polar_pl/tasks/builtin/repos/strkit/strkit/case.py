"""Identifier case conversion."""


def to_snake(name):
    """CamelCase / camelCase -> snake_case."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper():
            if i > 0 and name[i - 1] != "_":
                out.append("_")
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)
