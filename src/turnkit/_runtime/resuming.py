"""Resuming a parked turn: check an answer against what the turn waits for, and
store it with who gave it, so the turn can be delivered again to go on.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import from_json, to_json

from .._errors import InvalidAnswerError, ResumeConflictError
from .._seams.store import NO_MESSAGES, SessionStore, parked_turn
from .._values.checkpoints import InputAnswer, SuspendCheckpoint
from .._values.decisions import Decision
from .._values.events import InputAnsweredEvent, InputRequestedEvent, TurnEvent
from .._values.records import TurnRecord
from .._values.step_ids import input_step_id
from .._values.text import storable_json
from .._values.turn_rules import move
from .._values.turns import TurnRequest
from .._values.writes import LogEvent, PutStep, Write
from .approvals import Grant, GrantSealer, check_answer, check_answerer


async def record_answer(
    store: SessionStore,
    sealer: GrantSealer,
    turn_id: str,
    input_id: str,
    value: Any,
    *,
    by: str | None,
    granted: Grant | None,
    source: str | None = None,
) -> TurnRequest:
    """Check the answer under the session's writer and commit it (the answer, the
    turn back to ``running`` and an ``input.answered`` event, together); return the
    delivery that replays the turn. When the turn waits on other questions too, it
    stays parked on those (a fresh ``input.requested`` lists them) and the delivery
    only announces that. Every refusal raises before anything is stored (see
    ``AgentSession.resume``)."""
    async with store.writer():
        record = await parked_turn(store)
        checkpoint = record.pending if record is not None else None
        if record is not None and record.held_by is not None:
            raise ResumeConflictError(
                f"turn {record.turn_id} of session {store.session_id} is held by agent "
                f"version {record.held_by}, not waiting for input: {record.error}"
            )
        if record is None or checkpoint is None:
            raise ResumeConflictError(
                f"session {store.session_id} is not waiting for input (turn {turn_id})"
            )
        if record.turn_id != turn_id:
            raise ResumeConflictError(
                f"session {store.session_id} waits on turn {record.turn_id}, not {turn_id}"
            )
        if record.cancel_reason is not None:
            # Cancelled in some process (a reset pending there, for one): it ends
            # where it waits, so an answer could no longer be used.
            raise ResumeConflictError(
                f"turn {turn_id} was cancelled ({record.cancel_reason}); it can no "
                "longer be resumed"
            )
        request = checkpoint.find(input_id)
        if request is None:
            waiting = ", ".join(repr(r.id) for r in checkpoint.requests)
            raise ResumeConflictError(f"turn {turn_id} waits for input {waiting}, not {input_id!r}")
        if request.kind == "timer":
            raise ResumeConflictError(
                f"turn {turn_id}'s {input_id!r} waits on the clock, not for an answer: "
                "end it early with session.wake()"
            )
        check_answerer(
            request,
            session_id=store.session_id,
            generation=checkpoint.generation,
            by=by,
            granted=granted,
            sealer=sealer,
        )
        if isinstance(value, Decision):
            value = value.to_dict()
        value = storable_json(value)  # what is checked is what is kept
        try:
            encoded = to_json(value)
        except ValueError as exc:
            raise InvalidAnswerError(
                f"the answer to input {input_id!r} is not JSON: {exc}"
            ) from None
        try:
            check_answer(request, value)
        except ValueError as exc:
            raise InvalidAnswerError(str(exc)) from None

        # Who answered is logged with the answer, in the same transaction: once,
        # however often the resumed turn is redelivered after a crash.
        seq = (await store.load(turn_id, from_index=NO_MESSAGES)).next_seq
        answered = InputAnsweredEvent(
            turn_id=turn_id,
            session_id=store.session_id,
            input_id=input_id,
            call_id=request.call_id,
            by=by,
            value=from_json(encoded),  # observers get a copy of their own
            source=source,
            kind=request.kind,
            tool=request.tool,
            seq=seq,
        )

        answer = InputAnswer(value=value, by=by)
        still = checkpoint.without(input_id) if len(checkpoint.requests) > 1 else None
        asked = (
            InputRequestedEvent(
                turn_id=turn_id,
                session_id=store.session_id,
                request=still.request,
                requests=still.requests,
                still_open=True,
                seq=seq + 1,
            )
            if still is not None
            else None
        )

        writes: list[Write] = [
            PutStep(input_step_id(turn_id, input_id), turn_id, answer.to_dict()),
            move(record, "running")
            if still is None  # else parked on the others still (each answered on its own)
            else move(record, "suspended", pending=still),
            LogEvent(answered),
        ]
        if asked is not None:
            writes.append(LogEvent(asked))
        await store.commit(writes)
    return replay_request(record, checkpoint, (answered,))


def replay_request(
    record: TurnRecord, checkpoint: SuspendCheckpoint, announce: tuple[TurnEvent, ...]
) -> TurnRequest:
    """The delivery that replays parked turn ``record`` once its wait is over, telling
    observers ``announce`` (the answers) first."""
    return TurnRequest(
        turn_id=record.turn_id,
        opening=record.opening,
        event=record.event,
        policy=checkpoint.policy,
        announce=announce,
        tenant=record.tenant,
    )
