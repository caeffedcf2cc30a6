"""What a tool's docstring tells the model: its description and each parameter's.

Parameters documented in a Google (``Args:``), NumPy (``Parameters``) or Sphinx
(``:param x:``) section go into the input schema, so the model reads each one
next to the field it describes. docstring-parser does the reading; it is
imported on first use, so ``import turnkit`` does not pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolDoc:
    """A docstring split for the model: the tool's description, and the parameters'."""

    description: str
    params: dict[str, str] = field(default_factory=dict)


def read_tool_doc(doc: str) -> ToolDoc:
    """Split ``doc`` (already ``inspect.cleandoc``-ed).

    A docstring that documents no parameter is the description as written. One that
    does loses its sections from the description (the parameters move into the
    schema); its text before them, and its ``Returns`` line if any, stay.
    """
    import docstring_parser  # lazily: see the module docstring

    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return ToolDoc(doc)  # not a docstring format we know: it is all description
    params = {p.arg_name: p.description for p in parsed.params if p.description}
    if not params:
        return ToolDoc(doc)
    parts = [p for p in (parsed.short_description, parsed.long_description) if p]
    returns = parsed.returns
    if returns is not None and returns.description and not returns.is_generator:
        parts.append(f"Returns: {returns.description}")
    return ToolDoc("\n\n".join(parts), params)
