"""``ToolInputError``: the model's input does not fit the tool (the model reads why)."""

from __future__ import annotations


class ToolInputError(ValueError):
    """The model's input does not match the tool's schema; the model reads the message."""
