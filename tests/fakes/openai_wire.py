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


@dataclass(frozen=True)
class Tokens:
    """The usage chunk's figures: prompt tokens include the cached ones, completion
    tokens the reasoning ones, as the API counts them."""

    prompt: int = 20
    completion: int = 7
    cached: int = 0
    reasoning: int = 0

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning},
        }


def _chunk(
    delta: dict[str, Any] | None, finish: str | None = None, usage: Tokens | None = None
) -> tuple[None, dict[str, Any]]:
    choices = []
    if delta is not None:
        choices.append({"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish})
    return (
        None,
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "gpt-test",
            "system_fingerprint": None,
            "choices": choices,
            "usage": usage.usage() if usage is not None else None,
        },
    )


def completion(
    *pieces: str,
    calls: Sequence[Call] = (),
    finish: str | None = "stop",
    reasoning: Sequence[str] = (),
    refusal: str | None = None,
    tokens: Tokens | None = Tokens(),
) -> Canned:
    """A streamed completion; ``finish=None`` ends it without a finish reason. Its
    last chunk reports ``tokens`` (no choices, as ``include_usage`` streams it)."""
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
    if tokens is not None:
        events.append(_chunk(None, usage=tokens))
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
