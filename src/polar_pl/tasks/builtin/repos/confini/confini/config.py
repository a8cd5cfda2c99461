"""Typed access to parsed sections, with `${key}` / `${section:key}` references."""

import re

_REF = re.compile(r"\$\{([^}]+)\}")


class ConfigError(Exception):
    pass


class Config:
    def __init__(self, sections):
        self.sections = sections

    def get(self, section, key, default=None):
        raw = self._raw(section, key)
        if raw is None:
            return default
        return self._interpolate(section, raw)

    def get_int(self, section, key, default=None):
        value = self.get(section, key)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"[{section}] {key}: not an integer: {value!r}") from None

    def get_bool(self, section, key, default=None):
        value = self.get(section, key)
        if value is None:
            return default
        if value == "true":
            return True
        if value == "false":
            return False
        raise ConfigError(f"[{section}] {key}: not a boolean: {value!r}")

    def _raw(self, section, key):
        key = key.lower()
        values = self.sections.get(section, {})
        if key in values:
            return values[key]
        return self.sections.get("DEFAULT", {}).get(key)

    def _interpolate(self, section, raw):
        def replace(match):
            ref = match.group(1)
            ref_section, _, ref_key = ref.rpartition(":")
            value = self._raw(ref_section or section, ref_key)
            if value is None:
                raise ConfigError(f"[{section}]: unknown reference ${{{ref}}}")
            return value

        return _REF.sub(replace, raw)
