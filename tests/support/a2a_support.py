"""What the A2A tests share: the official ``a2a-sdk`` client against a served app,
and an agent (on ``ScriptedModel``) that answers, parks on questions, or holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import new_data_part, new_text_part
from a2a.types import AgentCard, Message, Part, Role, SendMessageRequest, StreamResponse

import turnkit
from turnkit import Answerers, ToolContext, UserMessage, tool
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

#: How long a test waits for any one thing to happen.
DEADLINE = 20.0


class Gate:
    """Holds the ``hold`` tool until released; says when it is holding."""

    def __init__(self) -> None:
        self.holding = asyncio.Event()
        self.released = asyncio.Event()
        self.runs = 0


def clerk(gate: Gate) -> turnkit.Agent:
    """The agent served: ``refund X`` asks one question, ``refund X and Y`` two at once
    (two calls of one step), ``hold`` waits for the gate, anything else is echoed."""

    @tool
    async def refund(order: str, ctx: ToolContext) -> str:
        """Refund an order once someone approves; only the lead approves A-2."""
        answerers = Answerers.user("lead") if order == "A-2" else None
        yes = await ctx.request_input(
            "approve", f"Refund {order}?", schema={"type": "boolean"}, answerers=answerers
        )
        return f"{order} refunded" if yes else f"{order} kept"

    @tool
    async def hold() -> str:
        """Wait for the gate."""
        gate.runs += 1
        gate.holding.set()
        await gate.released.wait()
        return "released"

    def respond(messages: Sequence[turnkit.Message]) -> ScriptedReply:
        last = messages[-1]
        if isinstance(last, UserMessage):
            words = last.text.split()
            if words[:1] == ["refund"]:
                orders = [w for w in words[1:] if w != "and"]
                calls = [tool_call("refund", {"order": o}, id=f"call_{o}") for o in orders]
                return ScriptedReply(text="Asking first.", tool_calls=calls)
            if last.text == "hold":
                return ScriptedReply(text="Holding.", tool_calls=[tool_call("hold", id="h")])
            return ScriptedReply(text=f"You said {last.text}.", chunks=3)
        results = [m for m in messages if isinstance(m, turnkit.ToolMessage)]
        return ScriptedReply(text="Done: " + ", ".join(str(m.result) for m in results) + ".")

    return turnkit.Agent(
        name="clerk",
        model=ScriptedModel(respond=respond),
        instructions="Help with refunds.",
        tools=[refund, hold],
    )


@asynccontextmanager
async def a2a_client(
    base: str, user: str | None = "ann", *, streaming: bool = True, agent: str = "clerk"
) -> AsyncIterator[tuple[Client, AgentCard]]:
    """The SDK's client for ``agent`` at ``base``, its card resolved over HTTP."""
    headers = {"X-User": user} if user else {}
    async with httpx.AsyncClient(headers=headers, timeout=DEADLINE) as http:
        card = await A2ACardResolver(http, f"{base}/agents/{agent}/a2a").get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)
        yield client, card


def message(
    text: str | None = None,
    *,
    data: Any = None,
    task_id: str = "",
    context_id: str = "",
    message_id: str | None = None,
) -> SendMessageRequest:
    parts: list[Part] = []
    if text is not None:
        parts.append(new_text_part(text))
    if data is not None:
        parts.append(new_data_part(data))
    given = Message(
        role=Role.ROLE_USER,
        message_id=message_id or f"m-{id(parts)}-{text}",
        task_id=task_id,
        context_id=context_id,
        parts=parts,
    )
    return SendMessageRequest(message=given)


async def send(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    """Everything the client yields for one message (one item, unless streaming)."""
    return [r async for r in client.send_message(request)]


def task_id_of(responses: Sequence[StreamResponse]) -> str:
    first = responses[0]
    return first.task.id if first.HasField("task") else first.status_update.task_id
