"""The check a turn meets when a delivery of another agent version takes it on:
its recorded tool calls read against the new version, and the agent's hook asked
what to do (docs/deploying.md). The version itself is ``agent_version``'s.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jsonschema

from .._errors import ConfigurationError
from .._values.messages import AssistantMessage, Message, ToolCall, ToolMessage
from .._values.versions import Rewrite, VersionChange, VersionDecision
from .output import OUTPUT_TOOL

if TYPE_CHECKING:
    from .agent import Agent
    from .turn_tools import TurnTools


def turn_calls(
    transcript: Sequence[Message], turn_id: str
) -> tuple[list[ToolCall], set[str], set[str]]:
    """The tool calls of turn ``turn_id`` in ``transcript``, in order; the ids of
    those with a result; and the ids of those whose result is an error."""
    calls: list[ToolCall] = []
    answered: set[str] = set()
    failed: set[str] = set()
    for message in transcript:
        if message.turn_id != turn_id:
            continue
        if isinstance(message, AssistantMessage):
            calls.extend(message.tool_calls)
        elif isinstance(message, ToolMessage):
            answered.add(message.call_id)
            if message.is_error:
                failed.add(message.call_id)
    return calls, answered, failed


def problems(
    tools: TurnTools, calls: Sequence[ToolCall], answered: set[str], failed: set[str]
) -> tuple[str, ...]:
    """What conflicts with this version among a turn's calls: a tool it called that
    is gone, or a call whose arguments the tool's input schema now refuses. A call
    that already failed is left out (its arguments may never have been valid)."""
    found: list[str] = []
    for call in calls:
        if call.name == OUTPUT_TOOL or call.id in failed:
            continue
        tool = tools.current(call.name)
        state = "owed" if call.id not in answered else "done"
        if tool is None:
            found.append(f"tool {call.name!r} (call {call.id}, {state}) is gone")
            continue
        error = schema_error(tool.spec.input_schema, call.input)
        if error is not None:
            found.append(
                f"tool {call.name!r} no longer accepts the arguments of call {call.id} "
                f"({state}): {error}"
            )
    return tuple(found)


def schema_error(schema: Any, value: Any) -> str | None:
    """Why ``value`` breaks the JSON schema ``schema``, or ``None``."""
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except jsonschema.SchemaError as exc:
        return f"its schema is invalid: {exc.message}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


async def decide(agent: Agent, change: VersionChange) -> VersionDecision:
    """What to do with ``change``: the agent's hook's answer, else the default
    (continue when compatible, refuse otherwise). A hook that returns something
    else, or raises, is a developer's mistake and fails loudly."""
    hook = agent.on_version_change
    if hook is None:
        return "continue" if change.compatible else "refuse"
    answer = hook(change)
    if inspect.isawaitable(answer):
        answer = await answer
    if answer in ("continue", "refuse"):
        return answer
    if isinstance(answer, Rewrite):
        owed = {c.id for c in change.owed}
        stray = sorted(set(answer.calls) - owed)
        if stray:
            raise ConfigurationError(
                f"agent {agent.name!r}: on_version_change rewrote calls {stray}, which "
                f"are not owed by turn {change.turn_id} (owed: {sorted(owed)})"
            )
        return answer
    raise ConfigurationError(
        f"agent {agent.name!r}: on_version_change must return 'continue', 'refuse' or a "
        f"Rewrite, got {answer!r}"
    )
