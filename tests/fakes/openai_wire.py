"""The OpenAI Chat Completions streaming wire format (which compatible servers copy).

Unnamed ``data:`` events, each a ``chat.completion.chunk``: the role first, then
content pieces and tool calls (id and name once, arguments in pieces, keyed by
``index``), a last chunk with ``finish_reason``, then ``data: [DONE]``. Errors are
JSON bodies ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .server import Canned


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # sent as is, so a test can send text that is not JSON


def _chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return (
        None,
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "gpt-test",
            "system_fingerprint": None,
            "choices": [choice],
        },
    )


def completion(
    *pieces: str,
    calls: Sequence[Call] = (),
    finish: str | None = "stop",
    reasoning: Sequence[str] = (),
    refusal: str | None = None,
) -> Canned:
    """A streamed completion; ``finish=None`` ends it without a finish reason."""
    events: list[tuple[str | None, Any]] = [_chunk({"role": "assistant", "content": ""})]
    events += [_chunk({"reasoning_content": r}) for r in reasoning]
    events += [_chunk({"content": p}) for p in pieces]
    if refusal is not None:
        events.append(_chunk({"refusal": refusal}))
    for index, call in enumerate(calls):
        head = {"index": index, "id": call.id, "type": "function"}
        events.append(
            _chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]})
        )
        cut = max(1, len(call.arguments) // 2)
        for part in (call.arguments[:cut], call.arguments[cut:]):
            events.append(
                _chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
            )
    if finish is not None:
        events.append(_chunk({}, finish))
    events.append((None, "[DONE]"))
    return Canned(events=tuple(events))


def error(
    status: int, text: str, *, code: str | None = None, retry_after_ms: str | None = "1"
) -> Canned:
    headers = {"x-request-id": f"req_{status}"}
    if retry_after_ms is not None:
        headers["retry-after-ms"] = retry_after_ms
    body = {"error": {"message": text, "type": "server_error", "param": None, "code": code}}
    return Canned(status=status, body=body, headers=headers)
