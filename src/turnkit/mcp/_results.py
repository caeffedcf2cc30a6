"""MCP tool results as turnkit's server gives them: a value the model (and a program)
can read, or an error with the text the model reads."""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult, TextContent
from pydantic_core import to_json


def success(value: Any, text: str | None = None) -> CallToolResult:
    """A result: ``value`` as structured content (when a JSON object) and as text."""
    shown = (
        text if text is not None else value if isinstance(value, str) else to_json(value).decode()
    )
    return CallToolResult(
        content=[TextContent(type="text", text=shown)],
        structured_content=value if isinstance(value, dict) else None,
    )


def failure(text: str, value: dict[str, Any] | None = None) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=value, is_error=True
    )
