"""The Anthropic Messages API's streaming wire format, built from a reply's blocks.

Event names and payloads follow the API: ``message_start``, ``ping``, per block
``content_block_start`` / ``content_block_delta`` / ``content_block_stop``, then
``message_delta`` with the stop reason and ``message_stop``; errors are JSON bodies
``{"type": "error", "error": {"type", "message"}}`` or a mid-stream ``error`` event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .server import Canned

Event = tuple[str | None, Any]


@dataclass(frozen=True)
class Text:
    pieces: tuple[str, ...]

    def events(self, index: int) -> list[Event]:
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in self.pieces]
        return _block(index, start, deltas)


@dataclass(frozen=True)
class Thinking:
    pieces: tuple[str, ...]
    signature: str

    def events(self, index: int) -> list[Event]:
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas: list[dict[str, Any]] = [
            {"type": "thinking_delta", "thinking": p} for p in self.pieces
        ]
        deltas.append({"type": "signature_delta", "signature": self.signature})
        return _block(index, start, deltas)


@dataclass(frozen=True)
class RedactedThinking:
    data: str

    def events(self, index: int) -> list[Event]:
        return _block(index, {"type": "redacted_thinking", "data": self.data}, [])


@dataclass(frozen=True)
class ToolUse:
    id: str
    name: str
    input: dict[str, Any]

    def events(self, index: int) -> list[Event]:
        start = {"type": "tool_use", "id": self.id, "name": self.name, "input": {}}
        text = json.dumps(self.input)
        cut = max(1, len(text) // 2)
        pieces = ["", text[:cut], text[cut:]]  # the API's first piece is often empty
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
        return _block(index, start, deltas)


Block = Text | Thinking | RedactedThinking | ToolUse


def text(*pieces: str) -> Text:
    return Text(pieces)


def _block(index: int, start: dict[str, Any], deltas: list[dict[str, Any]]) -> list[Event]:
    events: list[Event] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


@dataclass(frozen=True)
class Tokens:
    """The usage a message reports: ``input`` excludes the cache reads and writes, as
    the API counts it; ``message_start`` carries the input side, ``message_delta``
    the final output count."""

    input: int = 12
    output: int = 9
    cache_read: int = 0
    cache_write: int = 0

    def start(self) -> dict[str, int]:
        return {
            "input_tokens": self.input,
            "output_tokens": 1,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation_input_tokens": self.cache_write,
        }


def message(
    *blocks: Block,
    stop_reason: str | None = "end_turn",
    finish: bool = True,
    tokens: Tokens = Tokens(),
) -> Canned:
    """A streamed message; ``finish=False`` cuts it off before ``message_delta``."""
    start = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": tokens.start(),
    }
    events: list[Event] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(blocks):
        events += block.events(index)
    if finish:
        delta = {"stop_reason": stop_reason, "stop_sequence": None}
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": delta,
                    "usage": {"output_tokens": tokens.output},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
    return Canned(events=tuple(events))


def error(status: int, kind: str, text: str, *, retry_after_ms: str | None = "1") -> Canned:
    """An HTTP error as the API sends it (with a short ``retry-after-ms`` by default)."""
    headers = {"request-id": f"req_{status}"}
    if retry_after_ms is not None:
        headers["retry-after-ms"] = retry_after_ms
    body = {"type": "error", "error": {"type": kind, "message": text}}
    return Canned(status=status, body=body, headers=headers)


def stream_error(
    *blocks: Block, kind: str = "overloaded_error", text: str = "Overloaded"
) -> Canned:
    """A stream that starts well and then sends the API's ``error`` event."""
    started = message(*blocks, finish=False)
    failure = ("error", {"type": "error", "error": {"type": kind, "message": text}})
    return Canned(events=(*started.events, failure))
