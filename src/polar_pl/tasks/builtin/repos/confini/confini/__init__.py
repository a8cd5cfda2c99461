"""confini: INI-style configuration files."""

from confini.config import Config, ConfigError
from confini.parser import parse

__all__ = ["Config", "ConfigError", "loads", "parse"]


def loads(text):
    return Config(parse(text))
