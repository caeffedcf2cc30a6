"""The tools a turn's tool sources listed when it opened, as the value stored with it.

A tool source (an MCP server, say) is asked for its tools once per turn; what it
answered is kept as one memo row, so a replay in any process, days later, offers
the model the very same names, descriptions and schemas and calls the same
targets, whatever the source lists by then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import MessageDecodeError
from .messages import JsonObject


@dataclass(frozen=True, kw_only=True)
class ListedTool:
    """One tool a source listed: what the model is told, and what the source calls.

    ``name`` is the name the model sees (a source may prefix it); ``target`` is the
    tool's own name at the source (an MCP server's name for it).
    """

    source: str
    name: str
    description: str
    input_schema: JsonObject
    target: str

    def to_dict(self) -> JsonObject:
        return {
            "source": self.source,
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "target": self.target,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ListedTool:
        if not isinstance(data, dict):
            raise MessageDecodeError("listed tool: expected a JSON object")
        texts = {}
        for key in ("source", "name", "description", "target"):
            value = data.get(key)
            if not isinstance(value, str):
                raise MessageDecodeError(f"listed tool: {key!r} must be a string, got {value!r}")
            texts[key] = value
        schema = data.get("input_schema")
        if not isinstance(schema, dict):
            raise MessageDecodeError("listed tool: 'input_schema' must be a JSON object")
        return cls(input_schema=schema, **texts)


@dataclass(frozen=True, kw_only=True)
class ListedTools:
    """Everything a turn's sources listed, in the agent's order of sources."""

    tools: tuple[ListedTool, ...] = ()

    def to_dict(self) -> JsonObject:
        return {"tools": [t.to_dict() for t in self.tools]}

    @classmethod
    def from_dict(cls, data: Any) -> ListedTools:
        if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
            raise MessageDecodeError("listed tools: expected a JSON object with a 'tools' list")
        return cls(tools=tuple(ListedTool.from_dict(t) for t in data["tools"]))
