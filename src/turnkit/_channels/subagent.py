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

from .._engine.context import ToolContext
from .._engine.tools import Tool, check_tool_name
from .._errors import FatalToolError, ToolDefinitionError
from .._seams.model import ToolSpec
from .._values.turns import TurnResult


class SubagentError(Exception):
    """The child turn failed or was cancelled; the parent's model reads why."""


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
        children = ctx.children
        if children is None:
            raise FatalToolError(f"subagent {agent_name!r} needs a Runtime to run in")
        if agent_name not in children.agent_names:
            raise FatalToolError(
                f"subagent tool {tool_name!r}: agent {agent_name!r} is not in the runtime "
                f"(it has {sorted(children.agent_names)})"
            )
        session_id, result = await children.run_child_turn(ctx, agent_name, task)
        return _answer(agent_name, session_id, result)

    return Tool(spec, run)


def _answer(agent_name: str, session_id: str, result: TurnResult) -> dict[str, Any]:
    if result.status == "completed":
        return {"agent": agent_name, "session_id": session_id, "text": result.text or ""}
    if result.status == "cancelled":
        raise SubagentError(f"{agent_name} was cancelled ({result.reason})")
    raise SubagentError(f"{agent_name} failed: {result.error or result.status}")
