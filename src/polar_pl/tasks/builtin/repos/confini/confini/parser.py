"""Text -> {section: {key: raw value}}."""

from confini.config import ConfigError


def parse(text):
    sections = {"DEFAULT": {}}
    current = sections["DEFAULT"]
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ConfigError(f"line {lineno}: unterminated section header")
            current = sections.setdefault(line[1:-1].strip(), {})
            continue
        if "=" not in line:
            raise ConfigError(f"line {lineno}: expected 'key = value'")
        parts = line.split("=")
        key, value = parts[0].strip(), parts[1]
        current[key.lower()] = _value(value)
    return sections


def _value(text):
    """Strip an inline comment and surrounding quotes."""
    for marker in ("#", ";"):
        if marker in text:
            text = text[: text.index(marker)]
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    return text
