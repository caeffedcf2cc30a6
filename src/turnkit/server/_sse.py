"""Server-sent events framing, as pure functions apart from any web framework.

One ``TurnEvent`` becomes one SSE event: ``event:`` its type, ``data:`` its JSON on
one line, and ``id:`` its sequence number when the store logged it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .._values.events import TurnEvent

#: A comment line: keeps an idle connection open and lets the server notice a gone client.
#: No blank line follows it: a blank line ends an event, and some clients (httpx-sse,
#: against the spec) then hand out an empty event once any event carried an ``id:``.
KEEPALIVE = b": keep-alive\n"

#: What ends a line in an SSE stream: CRLF, LF or CR.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

#: Characters JSON leaves raw that some clients still take for line breaks (Python's
#: ``str.splitlines``, which httpx's line reader follows, splits on them): escaped,
#: so one event's JSON stays on one ``data:`` line for every client.
_SPLITLINES_ONLY = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def frame(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
    """One SSE event. Multi-line ``data`` (CRLF, LF or CR) becomes several ``data:``
    lines, as the format requires; ``event`` and ``id`` may not contain line breaks."""
    lines: list[str] = []
    if id is not None:
        _single_line("id", id)
        if "\0" in id:
            raise ValueError("an SSE id may not contain NUL")
        lines.append(f"id: {id}")
    if event is not None:
        _single_line("event", event)
        lines.append(f"event: {event}")
    lines.extend(f"data: {line}" for line in _LINE_BREAK.split(data))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def json_line(value: Any) -> str:
    """``value`` as JSON on one line that every SSE client reads as one line."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.translate(_SPLITLINES_ONLY)


def event_frame(event: TurnEvent) -> bytes:
    """The SSE event for a ``TurnEvent``; deltas (no ``seq``) carry no ``id:``."""
    seq = event.seq
    data = event.to_dict()  # an UnknownEvent's is the event as logged, its type included
    name = str(data.get("type", event.type))
    return frame(json_line(data), event=name, id=None if seq is None else str(seq))


def _single_line(field: str, value: str) -> None:
    if "\n" in value or "\r" in value:
        raise ValueError(f"an SSE {field} may not contain a line break: {value!r}")
