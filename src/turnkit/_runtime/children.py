"""Child turns: how a tool's call runs another agent's turn in a session of its own.

The child's session and turn ids derive from the parent call's idempotency key, so
a replayed parent finds the same child turn (and a parent turn id reused after a
reset makes a new child); a parked child parks the parent with its question and
gets the parent's answer passed on, with a grant only once that answer is found
stored with the parent's turn. The child is its parent's tenant's (placed in its
cell, counted in its budget) and every delivery of it the parent asks for runs on
the parent's tenant slot, never waiting for one of its own: a parent holding its
tenant's last slot could otherwise wait forever for its child. Tools reach this
through ``ToolContext.children`` (the ``ChildTurns`` protocol), never through the
runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .._engine.approval import ask_again
from .._engine.context import ToolContext
from .._errors import FatalToolError
from .._seams.sink import EventSink
from .._values.checkpoints import InputAnswer
from .._values.events import SubagentEvent, TurnEvent
from .._values.inbound import Proactive
from .._values.inputs import InputRequest
from .._values.records import TERMINAL_TURN_STATUSES, TurnRecord
from .._values.step_ids import input_step_id, relayed_input_id
from .._values.turn_options import TurnOptions
from .._values.turns import TurnResult, result_from_record
from .approvals import Grant, GrantSealer


class ChildSession(Protocol):
    """What running a child turn needs of a session (``AgentSession`` has it)."""

    @property
    def session_id(self) -> str: ...

    async def turn_record(self, turn_id: str) -> TurnRecord | None: ...

    def subscribe(
        self,
        callback: Callable[[TurnEvent], None],
        *,
        turn_id: str | None = None,
        replay: bool = False,
    ) -> Callable[[], None]: ...

    def open_child_turn(self, task: str, opts: TurnOptions, deny: frozenset[str]) -> str: ...

    async def result(self, turn_id: str) -> TurnResult: ...

    async def resume_child(
        self, turn_id: str, input_id: str, value: Any, *, by: str | None, granted: Grant | None
    ) -> str: ...


class ChildHost(Protocol):
    """What running a child turn needs of the runtime (``Runtime`` has it)."""

    @property
    def agents(self) -> dict[str, Any]: ...

    @property
    def sink(self) -> EventSink: ...

    def session(self, agent_name: str, session_id: str) -> ChildSession: ...


class RuntimeChildren:
    """The runtime's side of ``ChildTurns``: what a tool context may ask of it."""

    def __init__(self, runtime: ChildHost, sealer: GrantSealer) -> None:
        self._runtime = runtime
        self._sealer = sealer

    @property
    def agent_names(self) -> frozenset[str]:
        return frozenset(self._runtime.agents)

    async def run_child_turn(
        self, parent: ToolContext, agent: str, task: str
    ) -> tuple[str, TurnResult]:
        return await run_child(self._runtime, self._sealer, parent, agent, task)


def child_ids(ctx: ToolContext, agent_name: str) -> tuple[str, str]:
    """The child session id and turn id for this call: the same on every replay."""
    key = ctx.idempotency_key
    return child_session_id(ctx.session_id, agent_name, key), key


def child_session_id(parent_session: str, agent_name: str, key: str) -> str:
    """The session a child turn of agent ``agent_name`` runs in, for the parent call
    whose idempotency key is ``key`` (that key is also the child's turn id)."""
    return f"{parent_session}/{agent_name}/{key[3:23]}"


async def run_child(
    runtime: ChildHost, sealer: GrantSealer, ctx: ToolContext, agent_name: str, task: str
) -> tuple[str, TurnResult]:
    """Run (or find) the child turn for this call; its session id and how it ended."""
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

    record = await child.turn_record(turn_id)
    if record is not None and record.status in TERMINAL_TURN_STATUSES:
        # Ended already (a replay of the parent): read it, never run it again.
        return session_id, result_from_record(record)
    unsubscribe = child.subscribe(forward, turn_id=turn_id)
    try:
        trigger = Proactive(by=f"agent:{ctx.agent.name}", source=ctx.source)
        # The parent's tenant: the child is placed, spends and moves with it.
        opts = TurnOptions(trigger=trigger, turn_id=turn_id, tenant=ctx.tenant)
        # An existing turn id redelivers (a running child continues, a parked one
        # re-announces its question); a new one opens with the parent's denials.
        child.open_child_turn(task, opts, ctx.denied_tools)
        result = await child.result(turn_id)
        while result.status == "suspended" and result.request is not None:
            await _pass_on_answer(sealer, ctx, child, result.request)
            result = await child.result(turn_id)
    finally:
        unsubscribe()
    return session_id, result


async def _pass_on_answer(
    sealer: GrantSealer, ctx: ToolContext, child: ChildSession, request: InputRequest
) -> None:
    """Ask the parent's answerer the child's question (parking the parent the first
    time), then resume the child with the answer the parent's turn stored."""
    parent_input = relayed_input_id(ctx.step_id, request.id)
    if request.decision is not None:
        await ask_again(ctx, parent_input, request)  # offered as a decision here too
    else:
        await ctx.request_input(
            parent_input,
            request.prompt,
            schema=request.schema,
            answerers=request.answerers or None,
        )
    answer = InputAnswer.from_dict(_stored_parent_answer(ctx, parent_input))
    record = await child.turn_record(request.turn_id)
    checkpoint = record.pending if record is not None else None
    if record is None or record.status != "suspended" or checkpoint is None:
        return  # answered some other way meanwhile: just read how the child goes on
    waiting = checkpoint.find(request.id)  # (the child may wait on several)
    if waiting is None:
        return
    # The parent's resume was checked against these same answerers, and its answer
    # is stored with the parent's turn: vouch for it to the child, in the
    # generation the child waits in.
    by = answer.by
    granted = next(
        (
            sealer.issue(
                session_id=child.session_id,
                generation=checkpoint.generation,
                request=waiting,
                answerer=a,
                by=by,
            )
            for a in waiting.answerers
            if a.kind == "policy"
        ),
        None,
    )
    await child.resume_child(request.turn_id, request.id, answer.value, by=by, granted=granted)


def _stored_parent_answer(ctx: ToolContext, parent_input: str) -> dict[str, Any]:
    """The answer the parent's turn has stored for ``parent_input`` (``{"value",
    "by"}``), read from the turn's memoized steps; never made up."""
    stored = ctx._steps.get(input_step_id(ctx.turn_id, parent_input))
    if not isinstance(stored, dict) or "value" not in stored:
        raise FatalToolError(
            f"turn {ctx.turn_id} has no stored answer to {parent_input!r}, so there is "
            "nothing to pass on to the child"
        )
    return stored
