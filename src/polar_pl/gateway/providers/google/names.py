"""Gemini's wire format accepts proto field names in either spelling: `maxOutputTokens` or
`max_output_tokens` (protobuf JSON parsing takes both). The Python genai SDK really sends some
nested fields snake_case (`thinkingConfig: {"include_thoughts": true}`), so requests are brought
to camelCase before conversion, except inside free-form values (function args and responses,
JSON schemas, property names), which are user data and stay exactly as sent.
"""

from __future__ import annotations

from typing import Any

# Values that are user data (Struct / JSON schema / map keys), never renamed inside.
_FREE_FORM = frozenset(
    {
        "args",
        "response",
        "parametersJsonSchema",
        "responseJsonSchema",
        "_responseJsonSchema",
        "labels",
        "default",
        "example",
        "enum",
        "required",
        "propertyOrdering",
    }
)


def camel(name: str) -> str:
    if "_" not in name or name.startswith("_"):
        return name
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def camelize(node: Any) -> Any:
    """Rename proto fields to camelCase throughout a request, leaving free-form values alone."""
    if isinstance(node, list):
        return [camelize(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = camel(key)
        if name in _FREE_FORM:
            out[name] = value
        elif name == "properties" and isinstance(value, dict):
            out[name] = {prop: camelize(schema) for prop, schema in value.items()}
        else:
            out[name] = camelize(value)
    return out
