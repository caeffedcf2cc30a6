"""The commits that move a turn between states: open, reopen, fail, park, cancel.

Each is planned here from the delivery's position (rows, events, messages) and
committed by the runner, which decides when; only opening reads the store first
(the turn it supersedes, the results that turn committed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import count

from .._errors import SessionSuspendedError
from .._seams.store import NO_MESSAGES
from .._values.checkpoints import SuspendCheckpoint, ToolStepResult
from .._values.events import (
    ActionCompletedEvent,
    InputRequestedEvent,
    StepRetryEvent,
    TurnCancelledEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnStartedEvent,
    TurnVersionChangedEvent,
)
from .._values.inbound import InboundEvent
from .._values.inputs import InputRequest
from .._values.messages import Message, OpeningMessage, ToolCall, ToolMessage
from .._values.policy import TurnPolicy
from .._values.records import TurnRecord
from .._values.step_ids import policy_step_id, tool_step_id, trace_step_id
from .._values.turn_rules import move, new_turn
from .._values.turns import TurnRequest
from .._values.writes import AppendMessage, PutStep, RequestCancel, Write
from .agent import Agent
from .batch import committed_results
from .delivery import Delivery, stored_turn
from .position import RunTools, next_step, stale_calls
from .retries import retry_waits
from .tool_call import copy_input
from .tool_results import error_result

STALE_CALL_ERROR = "not run: the turn that asked for this call failed before it ran"
INTERRUPTED_CALL_ERROR = (
    "interrupted: the process running this call stopped before its result was saved; "
    "it may or may not have run, so check before retrying it"
)
SUPERSEDED_ERROR = "interrupted: a later turn started before it was recovered"


class Refused(Exception):
    """A queued turn cannot open (the session parked before it ran)."""


@dataclass(frozen=True)
class Planned:
    """One commit, ready: its rows, its events (numbered from ``next_seq``), the
    messages that join the transcript once it lands, and the delivery's turn as
    stored after it (``None``: this commit does not move it)."""

    writes: list[Write]
    events: list[TurnEvent]
    messages: Sequence[Message] = ()
    turn: TurnRecord | None = None


def opening_policy(agent: Agent, request: TurnRequest, event: InboundEvent | None) -> TurnPolicy:
    """The policy a new turn opens with: its agent's for the turn's source, plus the
    tools it inherited denied (a child turn gets its parent's denials)."""
    source = event.source if event is not None else request.source
    policy = agent.policy_for(source)
    if request.inherited_deny:
        policy = replace(policy, deny_tools=policy.deny_tools | request.inherited_deny)
    return policy


async def plan_opening(
    d: Delivery,
    opening: OpeningMessage,
    *,
    queued: TurnRecord | None,
    finished: str | None,
    owner: str | None,
) -> Planned:
    """The turn's opening commit. The turn before it, if a crash left it open, ends
    in the same commit (ours supersedes it); ``finished`` is a turn known to have
    ended for good, so it need not be looked up. ``queued`` is the turn's stored
    record when it was submitted ahead (it opens where it stands)."""
    previous = d.transcript[-1].turn_id if d.transcript else None
    if previous is None or previous == finished:
        stale = None  # none, or the turn our last delivery ended for good
    else:
        stale = await d.store.turn(previous)
    if stale is not None and stale.status == "suspended":
        refusal = (
            f"session {d.session_id} is waiting for input on turn {stale.turn_id}; "
            "resume it (or reset the session) before starting another turn"
        )
        if queued is not None:  # submitted while the park was on its way: it ends here
            raise Refused(refusal)
        raise SessionSuspendedError(refusal)
    crashed = stale if stale is not None and stale.status == "running" else None
    closing = await _closing_results(d, INTERRUPTED_CALL_ERROR if crashed else STALE_CALL_ERROR)
    record = TurnRecord(
        session_id=d.session_id,
        turn_id=d.turn_id,
        agent=d.agent.name,
        status="running",
        opening=opening,
        event=d.event,
        created_at=time.time(),
        version=d.agent.turn_version,
        tenant=d.tenant,
    )
    seq = count(d.next_seq)
    sid = d.session_id
    events: list[TurnEvent] = [
        ActionCompletedEvent(
            turn_id=m.turn_id,
            session_id=sid,
            call_id=m.call_id,
            name=m.name,
            result=copy_input(m.result),
            error=m.result["error"],
            seq=next(seq),
        )
        for step_id, m in closing
        if step_id is not None
    ]
    if crashed is not None:
        events.append(
            TurnFailedEvent(
                turn_id=crashed.turn_id, session_id=sid, error=SUPERSEDED_ERROR, seq=next(seq)
            )
        )
    version = d.agent.turn_version
    if queued is not None and queued.version is not None and queued.version != version:
        # Queued by another version, opened by this one: nothing of it ran yet.
        events.append(
            TurnVersionChangedEvent(
                turn_id=d.turn_id,
                session_id=sid,
                from_version=queued.version,
                to_version=version,
                action="continued",
                seq=next(seq),
            )
        )
    events.append(
        TurnStartedEvent(turn_id=d.turn_id, session_id=sid, text=opening.text, seq=next(seq))
    )
    index = len(d.transcript)
    turn_id, steps = d.turn_id, d.steps
    policy = d.policy.to_dict()
    stored_trace = trace_step_id(turn_id) in steps
    context = None if stored_trace else d.span.context()

    writes: list[Write] = []
    for offset, (step_id, msg) in enumerate(closing):
        if step_id is not None:
            stored = ToolStepResult(result=msg.result, error=msg.result["error"])
            writes.append(PutStep(step_id, msg.turn_id, stored.to_dict()))
        writes.append(AppendMessage(index + offset, msg))
    if crashed is not None:
        writes.append(move(crashed, "failed", error=SUPERSEDED_ERROR))
    writes.append(AppendMessage(index + len(closing), opening))
    put = (
        new_turn(record, owner=owner)
        if queued is None
        else move(queued, "running", version=version)
    )
    writes.append(put)
    if policy_step_id(turn_id) not in steps:  # a queued turn has it
        writes.append(PutStep(policy_step_id(turn_id), turn_id, policy))
    if context:  # the trace later deliveries of this turn refer to
        writes.append(PutStep(trace_step_id(turn_id), turn_id, context))
    return Planned(writes, events, [m for _, m in closing] + [opening], put.record)


async def _closing_results(d: Delivery, reason: str) -> list[tuple[str | None, ToolMessage]]:
    """Results for the calls an earlier turn left unanswered at the tail: the ones
    it committed (a call of a parallel batch that finished), else an error, with
    the step id to store it under (``None``: stored already)."""
    stale = stale_calls(d.transcript, d.turn_id)
    if stale is None:
        return []
    index, calls = stale
    owner = d.transcript[index].turn_id
    steps = (await d.store.load(owner, from_index=NO_MESSAGES)).steps
    kept = committed_results(index, calls, dict(steps.items()), owner)
    return [
        (None, kept[c.id])
        if c.id in kept
        else (
            tool_step_id(index, c.id),
            ToolMessage(
                call_id=c.id,
                name=c.name,
                result=error_result(reason),
                turn_id=owner,
                is_error=True,
            ),
        )
        for c in calls
    ]


def plan_reopen(d: Delivery, record: TurnRecord) -> Planned:
    """A failed turn's redelivery: running again, announced as started."""
    turn_id = d.turn_id
    text = record.opening.text
    started = TurnStartedEvent(turn_id=turn_id, session_id=d.session_id, text=text, seq=d.next_seq)
    put = move(record, "running")
    return Planned([put], [started], turn=put.record)


def plan_failure(d: Delivery, error: str) -> Planned:
    turn_id = d.turn_id
    failed = TurnFailedEvent(turn_id=turn_id, session_id=d.session_id, error=error, seq=d.next_seq)
    put = move(stored_turn(d), "failed", error=error)
    return Planned([put], [failed], turn=put.record)


def plan_park(d: Delivery, requests: tuple[InputRequest, ...], opening: OpeningMessage) -> Planned:
    """The one suspend checkpoint: the requests (one per call that asked) and what a
    resume in another process needs to replay the turn as it was opened (``opening``
    as stored: a redelivery may have been started with other text)."""
    first = requests[0]
    checkpoint = SuspendCheckpoint(
        request=first,
        call_id=first.call_id,
        opening_text=opening.text,
        event=d.event,
        policy=d.policy,
        generation=d.generation,
        requests=requests,
    )
    turn_id = d.turn_id
    event = InputRequestedEvent(
        turn_id=turn_id,
        session_id=d.session_id,
        request=first,
        requests=requests,
        seq=d.next_seq,
    )
    put = move(stored_turn(d), "suspended", pending=checkpoint)
    retries = [
        StepRetryEvent(
            turn_id=turn_id,
            session_id=d.session_id,
            step_id=step_id,
            attempt=failures + 1,
            error=r.prompt,
            retry_at=r.expires_at,
            seq=d.next_seq + 1 + n,
        )
        for n, (r, step_id, failures) in enumerate(retry_waits(requests))
        if r.expires_at is not None
    ]
    return Planned([put], [event, *retries], turn=put.record)


def plan_cancel(d: Delivery, reason: str) -> Planned:
    """End the turn ``cancelled`` in one commit. Calls of the current batch that had
    not run get a synthetic result, so the transcript stays valid for the next
    model call; no ``action.completed`` is emitted for them."""
    turn_id = d.turn_id
    step = next_step(d.transcript, turn_id)
    owed: Sequence[ToolCall] = step.owed if isinstance(step, RunTools) else ()
    index = len(d.transcript)
    assistant_index = step.assistant_index if isinstance(step, RunTools) else 0
    # Calls of the batch whose result committed (they finished) keep it.
    kept = committed_results(assistant_index, owed, d.steps, turn_id)
    result = {"cancelled": True, "reason": reason}
    messages = [
        kept.get(c.id)
        or ToolMessage(
            call_id=c.id, name=c.name, result=dict(result), turn_id=turn_id, is_error=True
        )
        for c in owed
    ]

    writes: list[Write] = []
    for offset, (call, message) in enumerate(zip(owed, messages, strict=True)):
        if call.id not in kept:
            stored = ToolStepResult(result=message.result, error=f"cancelled: {reason}")
            step_id = tool_step_id(assistant_index, call.id)
            writes.append(PutStep(step_id, turn_id, stored.to_dict()))
        writes.append(AppendMessage(index + offset, message))
    writes.append(RequestCancel(turn_id, reason))
    put = move(stored_turn(d), "cancelled")
    writes.append(put)

    event = TurnCancelledEvent(
        turn_id=turn_id, session_id=d.session_id, reason=reason, seq=d.next_seq
    )
    return Planned(writes, [event], messages, put.record)
