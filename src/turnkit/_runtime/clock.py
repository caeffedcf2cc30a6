"""Settling a parked turn's clock: its passed deadlines, due reminders and ended
timers, in one commit (see ``timers`` for the loop that finds them).

Every wait on the clock is a request of a parked turn (``InputRequest.expires_at``,
``remind_at``), and the turn's record carries the earliest of them as ``wake_at``,
indexed by the store. One process per store fires them: the timer loop lists the
turns whose time has come (``TimerStore.due_turns``) and settles each under the
session's writer lock, in one commit that is a compare-and-set on the turn still
being parked. So a deadline fires once however many processes try; a process that
was down fires what fell due meanwhile as it starts, and says how late.

On a store that holds elections (PostgreSQL) the loop runs only while its process
leads the election ``turnkit:timers`` (as the scheduler and retention do), so one
process per store lists and fires; another takes over when it dies. A fired turn is
then delivered by the firing process, or, where workers claim turns (``Worker``),
left to their claims so the work spreads across them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Literal

from .._seams.store import NO_MESSAGES, SessionStore
from .._values.checkpoints import InputAnswer
from .._values.events import (
    InputAnsweredEvent,
    InputExpiredEvent,
    InputReminderEvent,
    InputRequestedEvent,
    TurnEvent,
)
from .._values.inputs import InputRequest, reminder_before_deadline
from .._values.records import TurnRecord
from .._values.step_ids import input_step_id
from .._values.turn_rules import move
from .._values.writes import LogEvent, PutStep, RequestCancel, Write

log = logging.getLogger("turnkit.timers")

#: Who a deadline's default answer is recorded as given by, and a timer's end.
BY_DEADLINE = "deadline"
BY_TIMER = "timer"

#: What settling a turn's due clock did: it runs on (``resumed``), it is to end
#: cancelled where it waits (``cancel``), it stays parked (reminders given, or
#: nothing was due any more: another process got there first).
Settled = Literal["resumed", "cancel", "parked"]


@dataclass(frozen=True)
class Woken:
    """One parked turn's clock settled: ``outcome``, the turn as stored before, and
    the events logged with it (for the delivery, or the live observers, to show)."""

    outcome: Settled
    record: TurnRecord
    events: tuple[TurnEvent, ...]


async def settle_due(
    store: SessionStore, turn_id: str, now: float, *, wake: bool = False, by: str | None = None
) -> Woken | None:
    """Act on what is due of parked turn ``turn_id`` at ``now``, in one commit: each
    passed deadline by its ``on_expiry``, each reminder due by an ``input.reminder``.
    The commit moves the turn from ``suspended`` (a compare-and-set), so an answer,
    a cancel or another firing that got there first makes it fail whole, changing
    nothing: no writer lock is taken, a parked turn having no delivery to wait for.
    With ``wake``, every timer request (``ctx.sleep``, a retry's backoff) ends now
    too, answered by ``by``. ``None``: the turn is not parked (any more), or nothing
    was due."""
    snapshot = await store.load(turn_id, from_index=NO_MESSAGES)
    record = snapshot.turn
    if record is None or record.status != "suspended" or record.cancel_reason is not None:
        return None
    checkpoint = record.pending
    if checkpoint is None:
        return None
    plan = _Plan(record, now, snapshot.next_seq)
    for request in checkpoint.requests:
        plan.consider(request, wake=wake, by=by)
    if not plan.writes and not plan.events:
        return None
    outcome: Settled
    if plan.cancel:
        outcome = "cancel"
        plan.writes.append(RequestCancel(turn_id, "expired"))
    elif plan.open:
        outcome = "parked"
        rest = replace(
            checkpoint, request=plan.open[0], call_id=plan.open[0].call_id, requests=plan.open
        )
        still = move(record, "suspended", pending=rest, held_by=record.held_by)
        plan.writes.append(still)
        if plan.answered:  # some questions went: tell who shows them what is left
            plan.events.append(
                InputRequestedEvent(
                    turn_id=turn_id,
                    session_id=record.session_id,
                    request=rest.request,
                    requests=rest.requests,
                    still_open=True,
                    seq=plan.next_seq(),
                )
            )
    else:
        outcome = "resumed"
        plan.writes.append(move(record, "running"))
    await store.commit([*plan.writes, *(LogEvent(e) for e in plan.events)])
    for event in plan.events:
        if isinstance(event, InputExpiredEvent) and event.late_by > _LATE:
            log.warning(
                "turn %s: the deadline of input %r fired %.0fs late (nothing was running "
                "to fire it sooner)",
                turn_id,
                event.input_id,
                event.late_by,
            )
    return Woken(outcome, record, tuple(plan.events))


#: How late (in seconds) a deadline may fire before it is logged as late.
_LATE = 60.0


class _Plan:
    """The writes and events of one turn's settling, gathered request by request."""

    def __init__(self, record: TurnRecord, now: float, seq: int) -> None:
        self.record = record
        self.now = now
        #: When this settling happens: how late a deadline fired is measured from it
        #: (a batch of due turns is listed at ``now`` and settled one after another).
        self.clock = max(now, time.time())
        self._seq = seq
        self.writes: list[Write] = []
        self.events: list[TurnEvent] = []
        self.open: tuple[InputRequest, ...] = ()
        self.answered = False
        self.cancel = False

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq - 1

    def consider(self, request: InputRequest, *, wake: bool, by: str | None) -> None:
        now = self.now
        due = request.expires_at is not None and request.expires_at <= now
        if request.kind == "timer" and (due or wake):
            self._answer(request, None, BY_TIMER if due else by)
            if due and request.expires_at is not None:
                self._expired(request, "answer", self.clock - request.expires_at)
            return
        if due and request.on_expiry is not None and request.expires_at is not None:
            action = request.on_expiry.action
            self._expired(request, action, self.clock - request.expires_at)
            if action == "answer":
                self._answer(request, request.on_expiry.value, BY_DEADLINE)
            elif action == "fail":
                self._put(request, InputAnswer(value=None, by=BY_DEADLINE, expired="fail"))
            else:
                self.cancel = True
            return
        if request.remind_at is not None and request.remind_at <= now:
            self.open += (self._remind(request),)
            return
        self.open += (request,)

    def _remind(self, request: InputRequest) -> InputRequest:
        """``request`` after its reminder is given, with the next one due (none past
        its deadline, or when it has no period)."""
        assert request.remind_at is not None
        every = request.remind_every
        asked = request.asked_at if request.asked_at is not None else request.remind_at
        number = 1 if not every else max(1, round((request.remind_at - asked) / every))
        self.events.append(
            InputReminderEvent(
                turn_id=self.record.turn_id,
                session_id=self.record.session_id,
                input_id=request.id,
                call_id=request.call_id,
                prompt=request.prompt,
                reminder=number,
                expires_at=request.expires_at,
                seq=self.next_seq(),
            )
        )
        following: float | None = None
        if every:
            following = request.remind_at + every
            while following <= self.now:  # down a while: one reminder, not a burst
                following += every
        return replace(request, remind_at=reminder_before_deadline(following, request.expires_at))

    def _answer(self, request: InputRequest, value: object, by: str | None) -> None:
        self._put(request, InputAnswer(value=value, by=by))
        self.events.append(
            InputAnsweredEvent(
                turn_id=self.record.turn_id,
                session_id=self.record.session_id,
                input_id=request.id,
                call_id=request.call_id,
                by=by,
                value=value,
                kind=request.kind,
                tool=request.tool,
                seq=self.next_seq(),
            )
        )

    def _put(self, request: InputRequest, answer: InputAnswer) -> None:
        turn_id = self.record.turn_id
        self.writes.append(PutStep(input_step_id(turn_id, request.id), turn_id, answer.to_dict()))
        self.answered = True

    def _expired(self, request: InputRequest, action: str, late: float) -> None:
        assert request.expires_at is not None
        self.events.append(
            InputExpiredEvent(
                turn_id=self.record.turn_id,
                session_id=self.record.session_id,
                input_id=request.id,
                call_id=request.call_id,
                action=action,
                expires_at=request.expires_at,
                late_by=round(max(0.0, late), 3),
                seq=self.next_seq(),
            )
        )
