"""The ops example agent: its settings and the offline demo replies."""

from __future__ import annotations

import re
from collections.abc import Sequence

from turnkit import Message, ToolMessage, UserMessage
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

agent = {"name": "ops"}

_ORDER = re.compile(r"order\s+(?:(\d+)\s+)?(.+)", re.IGNORECASE)


def _reply(transcript: Sequence[Message]) -> ScriptedReply:
    """Decide the next step from the transcript alone, so replays are deterministic."""
    last = transcript[-1]
    if isinstance(last, UserMessage):
        match = _ORDER.search(last.text)
        if match is None:
            return ScriptedReply(
                text="(offline demo) I place and track orders. Try: order 2 blue widgets"
            )
        qty = int(match.group(1) or 1)
        item = match.group(2).strip().rstrip(".!")
        return ScriptedReply(
            text=f"Placing an order for {qty} x {item}.",
            tool_calls=[tool_call("create_order", {"item": item, "quantity": qty})],
        )
    if isinstance(last, ToolMessage) and last.name == "create_order" and not last.is_error:
        order_id = last.result["order_id"]
        return ScriptedReply(
            text="Checking its status.",
            tool_calls=[tool_call("lookup_order", {"order_id": order_id})],
        )
    if isinstance(last, ToolMessage) and last.name == "lookup_order" and not last.is_error:
        placed = next(
            m.result
            for m in reversed(transcript)
            if isinstance(m, ToolMessage) and m.name == "create_order"
        )
        return ScriptedReply(
            text=f"Done: order #{placed['order_id']} ({placed['quantity']} x {placed['item']}) "
            f"is {last.result['status']}."
        )
    return ScriptedReply(text=f"Something went wrong: {getattr(last, 'result', '')}")


def demo_model() -> ScriptedModel:
    """Offline replies for `turnkit run` when no model is configured."""
    return ScriptedModel(respond=_reply)
