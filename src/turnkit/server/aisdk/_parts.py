"""The AI SDK's UI message stream parts for a turn's story, as pure functions.

Each ``Story`` item becomes zero or more parts (``{"type": "text-delta", …}``), sent
as SSE ``data:`` lines; the stream opens with ``start`` (the turn id as the
assistant message's id) and ends with ``finish``, ``abort`` or ``error`` and then
``[DONE]``. See docs/frontends.md for the table.
"""

from __future__ import annotations

from typing import Any

from ..._values.inputs import InputRequest
from .._sse import json_line
from .._story import (
    Answered,
    Asked,
    Ended,
    Item,
    StepClosed,
    StepOpened,
    TextAdded,
    TextClosed,
    TextOpened,
    ToolCalled,
    ToolReturned,
)

Part = dict[str, Any]

#: The header that tells the AI SDK's client which stream protocol it reads.
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "x-vercel-ai-ui-message-stream": "v1",
}
DONE = b"data: [DONE]\n\n"
#: Marks a text part a newer delivery of its step replaced (the turn was taken over
#: mid-reply): a renderer hides it.
SUPERSEDED = {"turnkit": {"superseded": True}}


def encode(part: Part) -> bytes:
    """One part as one SSE event."""
    return f"data: {json_line(part)}\n\n".encode()


def start(message_id: str) -> Part:
    return {"type": "start", "messageId": message_id}


def parts_of(item: Item) -> list[Part]:
    """The UI message stream parts for one item of a turn's story."""
    match item:
        case StepOpened():
            return [{"type": "start-step"}]
        case StepClosed():
            return [{"type": "finish-step"}]
        case TextOpened(part=id, kind=kind):
            return [{"type": f"{kind}-start", "id": id}]
        case TextAdded(part=id, kind=kind, text=text):
            return [{"type": f"{kind}-delta", "id": id, "delta": text}]
        case TextClosed(part=id, kind=kind, superseded=superseded):
            closed: Part = {"type": f"{kind}-end", "id": id}
            if superseded:
                closed["providerMetadata"] = SUPERSEDED
            return [closed]
        case ToolCalled(call=call):
            return [
                {
                    "type": "tool-input-available",
                    "toolCallId": call.id,
                    "toolName": call.name,
                    "input": call.input,
                    "dynamic": True,
                }
            ]
        case ToolReturned(call_id=call_id, result=result, error=error):
            if error is not None:
                return [
                    {
                        "type": "tool-output-error",
                        "toolCallId": call_id,
                        "errorText": error,
                        "dynamic": True,
                    }
                ]
            return [
                {
                    "type": "tool-output-available",
                    "toolCallId": call_id,
                    "output": result,
                    "dynamic": True,
                }
            ]
        case Asked(requests=requests):
            return [_approval(r) for r in requests]
        case Answered():
            return []  # the client made the answer; the tool's output follows
        case Ended(how=how, detail=detail):
            return _ending(how, detail)
    return []


def _approval(request: InputRequest) -> Part:
    return {
        "type": "tool-approval-request",
        "approvalId": request.id,
        "toolCallId": request.call_id,
    }


def _ending(how: str, detail: str) -> list[Part]:
    if how == "completed":
        return [{"type": "finish", "finishReason": "stop"}]
    if how == "parked":
        return [{"type": "finish", "finishReason": "tool-calls"}]
    if how == "cancelled":
        return [{"type": "abort", "reason": detail}]
    return [{"type": "error", "errorText": detail}]
