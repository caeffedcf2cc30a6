"""Subagents: a tool that runs another agent's turn as a child session.

The child's session and turn ids derive from the parent's tool call (its
idempotency key), so a replay of the parent never opens a second child turn: it
finds the same child turn and waits for it, or reads how it ended (a child that
failed is not run again). The child runs under the parent turn's source and can
use none of the tools the parent turn was denied, so a source's ``deny_tools``
cannot be sidestepped by handing the task to another agent. A child that parks
parks the parent with the same question; the parent's answer is passed on to the
child when it resumes.
The child's events reach the parent's observers wrapped in ``SubagentEvent``.
"""

from __future__ import annotations

from typing import Any

from ._approvals import Grant
from ._context import ToolContext
from ._errors import FatalToolError, ToolDefinitionError
from ._events import SubagentEvent, TurnEvent
from ._inbound import Proactive
from ._inputs import InputRequest, input_step_id
from ._model import ToolSpec
from ._runtime import AgentSession, Runtime
from ._store import TERMINAL_TURN_STATUSES
from ._tools import Tool, check_tool_name
from ._turns import TurnResult, result_from_record


class SubagentError(Exception):
    """The child turn failed or was cancelled; the parent's model reads why."""


def child_ids(ctx: ToolContext, agent_name: str) -> tuple[str, str]:
    """The child session id and turn id for this call: the same on every replay."""
    key = ctx.idempotency_key
    return f"{ctx.session_id}/{agent_name}/{key[3:23]}", key


def subagent(agent_name: str, *, description: str, name: str | None = None) -> Tool:
    """A tool that hands a ``task`` to agent ``agent_name`` and returns its answer.

    The agent must be one of the runtime's agents. The tool is named ``name``
    (default: the agent's name); ``description`` tells the model when to use it.
    """
    tool_name = check_tool_name(name or agent_name)
    if not isinstance(description, str) or not description.strip():
        raise ToolDefinitionError(f"subagent {agent_name!r}: description must be a non-empty str")
    spec = ToolSpec(
        name=tool_name,
        description=description,
        input_schema={
            "type": "object",
            "properties": {
                "task": {
                    "type": "string",
                    "description": f"What {agent_name} should do, with everything it needs.",
                }
            },
            "required": ["task"],
            "additionalProperties": False,
        },
    )

    async def run(data: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        task = data.get("task")
        if not isinstance(task, str) or not task.strip():
            raise ValueError("task must be a non-empty string")
        runtime = ctx.runtime
        if runtime is None:
            raise FatalToolError(f"subagent {agent_name!r} needs a Runtime to run in")
        if agent_name not in runtime.agents:
            raise FatalToolError(
                f"subagent tool {tool_name!r}: agent {agent_name!r} is not in the runtime "
                f"(it has {sorted(runtime.agents)})"
            )
        return await run_child(runtime, ctx, agent_name, task)

    return Tool(spec, run)


async def run_child(
    runtime: Runtime, ctx: ToolContext, agent_name: str, task: str
) -> dict[str, Any]:
    """Run (or find) the child turn for this call and return its answer."""
    session_id, turn_id = child_ids(ctx, agent_name)
    child = runtime.session(agent_name, session_id)

    def forward(event: TurnEvent) -> None:
        runtime.sink.emit(
            SubagentEvent(
                turn_id=ctx.turn_id,
                session_id=ctx.session_id,
                call_id=ctx.call_id,
                agent=agent_name,
                event=event,
            )
        )

    record = await child._store.turn(turn_id)
    if record is not None and record.status in TERMINAL_TURN_STATUSES:
        # Ended already (a replay of the parent): read it, never run it again.
        return _answer(agent_name, session_id, result_from_record(record))
    unsubscribe = child.subscribe(forward, turn_id=turn_id)
    try:
        trigger = Proactive(by=f"agent:{ctx.agent.name}", source=ctx.source)
        # An existing turn id redelivers (a running child continues, a parked one
        # re-announces its question); a new one opens with the parent's denials.
        child._start(task, None, trigger, False, turn_id, ctx.denied_tools)
        result = await child.result(turn_id)
        while result.status == "suspended" and result.request is not None:
            await _pass_on_answer(runtime, ctx, child, result.request)
            result = await child.result(turn_id)
    finally:
        unsubscribe()
    return _answer(agent_name, session_id, result)


async def _pass_on_answer(
    runtime: Runtime, ctx: ToolContext, child: AgentSession, request: InputRequest
) -> None:
    """Ask the parent's answerer the child's question (parking the parent the first
    time), then resume the child with the answer."""
    parent_input = f"{ctx.step_id}/{request.id}"
    value = await ctx.request_input(
        parent_input,
        request.prompt,
        schema=request.schema,
        answerers=request.answerers or None,
    )
    stored = ctx._steps.get(input_step_id(ctx.turn_id, parent_input)) or {}
    by = stored.get("by")
    waiting = await child.pending()
    if waiting is None or waiting.turn_id != request.turn_id or waiting.id != request.id:
        return  # answered some other way meanwhile: just read how the child goes on
    # The parent's resume was checked against the same answerers; vouch for it.
    granted = next(
        (
            runtime.grants.seal(
                Grant(
                    session_id=child.session_id,
                    turn_id=request.turn_id,
                    input_id=request.id,
                    policy=a.policy,
                    scope=a.scope,
                    by=by,
                )
            )
            for a in request.answerers
            if a.kind == "policy" and a.policy is not None
        ),
        None,
    )
    await child.resume(request.turn_id, request.id, value, by=by, granted=granted)


def _answer(agent_name: str, session_id: str, result: TurnResult) -> dict[str, Any]:
    if result.status == "completed":
        return {"agent": agent_name, "session_id": session_id, "text": result.text or ""}
    if result.status == "cancelled":
        raise SubagentError(f"{agent_name} was cancelled ({result.reason})")
    raise SubagentError(f"{agent_name} failed: {result.error or result.status}")
