"""OpenAI's strict structured outputs: whether a JSON schema fits its subset, and the
schema in the form strict mode wants.

Strict mode decodes against the schema, so it accepts only a subset of JSON Schema:
every object lists all its properties as required and allows no others. This keeps
to the keywords OpenAI documents for it; a schema using anything else is sent
without ``strict`` and the engine's own validation catches what the model gets wrong.
"""

from __future__ import annotations

from typing import Any

from .._values.messages import JsonObject

#: Keywords strict mode is documented to accept.
_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "enum",
        "const",
        "description",
        "title",
        "$ref",
        "$defs",
        "pattern",
        "format",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "minItems",
        "maxItems",
    }
)
#: String formats strict mode knows.
_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)


def strict_schema(schema: JsonObject) -> JsonObject | None:
    """``schema`` with ``additionalProperties: false`` on every object, or ``None`` when
    strict mode cannot take it (an optional property, a free-form dict, a keyword
    outside the subset). The schema given is not changed."""
    strict = _strict(schema)
    return strict if isinstance(strict, dict) else None


def _strict(node: Any) -> Any:
    if not isinstance(node, dict):
        return None
    if not set(node) <= _KEYWORDS or ("$ref" in node and len(node) > 1):
        return None
    if "format" in node and node["format"] not in _FORMATS:
        return None
    out = dict(node)
    if node.get("type") == "object" or "properties" in node:
        properties = node.get("properties")
        if not isinstance(properties, dict) or node.get("additionalProperties", False):
            return None
        if sorted(node.get("required", [])) != sorted(properties):
            return None
        out["additionalProperties"] = False
        out["properties"] = _each(properties)
        if out["properties"] is None:
            return None
    if "$defs" in node:
        out["$defs"] = _each(node["$defs"])
        if out["$defs"] is None:
            return None
    if "items" in node:
        out["items"] = _strict(node["items"])
        if out["items"] is None:
            return None
    if "anyOf" in node:
        branches = [_strict(b) for b in node["anyOf"]] if isinstance(node["anyOf"], list) else []
        if not branches or any(b is None for b in branches):
            return None
        out["anyOf"] = branches
    return out


def _each(nodes: Any) -> JsonObject | None:
    """Every schema of a name → schema map made strict, or ``None`` if one cannot be."""
    if not isinstance(nodes, dict):
        return None
    out = {name: _strict(node) for name, node in nodes.items()}
    return None if any(v is None for v in out.values()) else out
