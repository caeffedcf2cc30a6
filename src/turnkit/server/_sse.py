"""Server-sent events framing, as pure functions apart from any web framework.

One ``TurnEvent`` becomes one SSE event: ``event:`` its type, ``data:`` its JSON on
one line, and ``id:`` its sequence number when the store logged it.
"""

from __future__ import annotations

import json

from .._events import TurnEvent

#: A comment line: keeps an idle connection open and lets the server notice a gone client.
KEEPALIVE = b": keep-alive\n\n"


def frame(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
    """One SSE event. Multi-line ``data`` becomes several ``data:`` lines, as the
    format requires; ``event`` and ``id`` may not contain line breaks."""
    lines: list[str] = []
    if id is not None:
        _single_line("id", id)
        if "\0" in id:
            raise ValueError("an SSE id may not contain NUL")
        lines.append(f"id: {id}")
    if event is not None:
        _single_line("event", event)
        lines.append(f"event: {event}")
    lines.extend(f"data: {line}" for line in data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def event_frame(event: TurnEvent) -> bytes:
    """The SSE event for a ``TurnEvent``; deltas (no ``seq``) carry no ``id:``."""
    data = json.dumps(event.to_dict(), ensure_ascii=False, separators=(",", ":"))
    seq = event.seq
    return frame(data, event=event.type, id=None if seq is None else str(seq))


def _single_line(field: str, value: str) -> None:
    if "\n" in value or "\r" in value:
        raise ValueError(f"an SSE {field} may not contain a line break: {value!r}")
