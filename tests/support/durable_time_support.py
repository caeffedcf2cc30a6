"""Agents that park on a clock (a question with a deadline, a failing call retried
after a backoff) and the moves of a test that fires their clocks: what the tests of
durable time and the console's view of parked turns share."""

from __future__ import annotations

from typing import Any

from eventually import eventually

import turnkit
from turnkit import ToolContext, ToolMessage, UserMessage, tool
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

APPROVAL = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}
HOUR = 3600.0


def asking_agent(answers: list[Any], **ask: Any) -> turnkit.Agent:
    """An agent whose one tool asks ``ok`` with ``ask``'s deadline options."""

    @tool
    async def approve(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        """Approve an order once a person says so."""
        answer = await ctx.request_input("ok", f"Approve {order_id}?", schema=APPROVAL, **ask)
        answers.append(answer)
        return {"approved": answer["approved"]}

    return turnkit.Agent(
        name="a", model=ScriptedModel(respond=calls_tool("approve")), tools=[approve]
    )


def calls_tool(name: str, **args: Any) -> Any:
    """A scripted reply: a user's text calls tool ``name`` on it as ``order_id``; the
    tool's result is answered ``done: <result>``."""

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call(name, {"order_id": last.text, **args})])
        if isinstance(last, ToolMessage):
            return f"done: {last.result}"
        return "?"

    return respond


async def parked(session: turnkit.AgentSession, text: str = "o-1") -> turnkit.TurnResult:
    """Run a turn on ``text`` here until it parks, and its (suspended) result."""
    result = await session.result(session.start(text))
    assert result.status == "suspended", result
    return result


async def fire(runtime: turnkit.Runtime, at: float) -> int:
    """Fire what is due at ``at`` (seconds since the epoch), as the loop would then."""
    return await runtime.timers.fire_due(runtime.store, now=at)  # type: ignore[arg-type]


async def ended(session: turnkit.AgentSession, turn_id: str, timeout: float = 20) -> Any:
    """The turn's result once it has ended, however many deliveries that takes."""

    async def over() -> bool:
        record = await session._store.turn(turn_id)
        return record is not None and record.status in ("completed", "failed", "cancelled")

    await eventually(over, what=f"turn {turn_id} ended", timeout=timeout)
    return await session.result(turn_id)


def flaky_agent(calls: list[str], fail: int, **options: Any) -> turnkit.Agent:
    """An agent whose tool fails its first ``fail`` runs with a passing error."""

    @tool(**options)
    async def fetch(order_id: str) -> str:
        """Fetch an order from a service that is sometimes down."""
        calls.append(order_id)
        if len(calls) <= fail:
            raise ConnectionError(f"service down ({len(calls)})")
        return f"order {order_id}"

    return turnkit.Agent(name="a", model=ScriptedModel(respond=calls_tool("fetch")), tools=[fetch])
