"""The ops example agent: its settings and the offline demo replies."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence

from turnkit import Message, ModelDelta, TextDelta, ToolCall, ToolMessage, ToolSpec, UserMessage
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

agent = {"name": "ops"}

_ORDER = re.compile(r"order\s+(?:(\d+)\s+)?(.+)", re.IGNORECASE)
_REFUND = re.compile(r"refund\s+(?:order\s+)?#?(\d+)", re.IGNORECASE)
#: The demo's replies stream in pieces of about this many characters...
_CHUNK_CHARS = 6
#: ...this many seconds apart, so a chat page shows them being typed.
_DELTA_PAUSE = 0.02


def _say(text: str, *calls: ToolCall) -> ScriptedReply:
    """A reply that streams in several small deltas."""
    return ScriptedReply(text=text, tool_calls=calls, chunks=-(-len(text) // _CHUNK_CHARS))


def _reply(transcript: Sequence[Message]) -> ScriptedReply:
    """Decide the next step from the transcript alone, so replays are deterministic."""
    last = transcript[-1]
    if isinstance(last, UserMessage):
        refund = _REFUND.search(last.text)
        if refund is not None:
            order_id = int(refund.group(1))
            return _say(
                f"Asking for approval to refund order #{order_id}.",
                tool_call("refund_order", {"order_id": order_id}),
            )
        match = _ORDER.search(last.text)
        if match is None:
            return _say(
                "(offline demo) I place, track and refund orders. "
                "Try: order 2 blue widgets, or: refund order 1"
            )
        qty = int(match.group(1) or 1)
        item = match.group(2).strip().rstrip(".!")
        return _say(
            f"Placing an order for {qty} x {item}.",
            tool_call("create_order", {"item": item, "quantity": qty}),
        )
    if isinstance(last, ToolMessage) and last.name == "create_order" and not last.is_error:
        order_id = last.result["order_id"]
        return _say("Checking its status.", tool_call("lookup_order", {"order_id": order_id}))
    if isinstance(last, ToolMessage) and last.name == "lookup_order" and not last.is_error:
        placed = next(
            m.result
            for m in reversed(transcript)
            if isinstance(m, ToolMessage) and m.name == "create_order"
        )
        return _say(
            f"Done: order #{placed['order_id']} ({placed['quantity']} x {placed['item']}) "
            f"is {last.result['status']}."
        )
    if isinstance(last, ToolMessage) and last.name == "refund_order" and not last.is_error:
        order_id = last.result["order_id"]
        if last.result["refunded"]:
            return _say(f"Refunded order #{order_id}.")
        return _say(f"Refund of order #{order_id} declined; nothing was changed.")
    result = getattr(last, "result", "")
    if isinstance(result, dict) and "error" in result:
        result = result["error"]
    return _say(f"Something went wrong: {result}")


class _PacedModel(ScriptedModel):
    """The scripted demo, with a short pause before each text delta."""

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
    ) -> AsyncIterator[ModelDelta]:
        async for delta in super().stream(messages, tools, system=system):
            if isinstance(delta, TextDelta):
                await asyncio.sleep(_DELTA_PAUSE)
            yield delta


def demo_model() -> ScriptedModel:
    """Offline replies for `turnkit run` and `turnkit dev` when no model is configured."""
    return _PacedModel(respond=_reply, record_calls=False)
