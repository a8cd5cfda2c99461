"""Gemini's function and response schemas (an OpenAPI subset: `"type": "OBJECT"`, `nullable`,
`propertyOrdering`) -> JSON schema, which is what chat templates and the engine's guided decoding
expect."""

from __future__ import annotations

from typing import Any

# Gemini Schema keys whose values are schemas (recursed into) or lists of schemas.
_SCHEMA_CHILD = ("items",)
_SCHEMA_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAP = ("properties", "$defs", "definitions")
_SCHEMA_DROP = ("propertyOrdering",)


def schema_to_json_schema(schema: Any) -> Any:
    """Gemini Schema (OpenAPI subset, types like "OBJECT") -> JSON schema (lowercase types)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_DROP or key == "nullable":
            continue
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key in _SCHEMA_CHILD:
            out[key] = schema_to_json_schema(value)
        elif key in _SCHEMA_LIST and isinstance(value, list):
            out[key] = [schema_to_json_schema(v) for v in value]
        elif key in _SCHEMA_MAP and isinstance(value, dict):
            out[key] = {name: schema_to_json_schema(v) for name, v in value.items()}
        else:
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out
