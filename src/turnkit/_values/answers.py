"""``AnswerRecord``: who answered a parked turn's question, when, through which
channel, and what they answered (a decision read back as a ``Decision``).

Records are read from the session's ``input.answered`` events, which the resume
logs in the transaction that stores the answer, so there is one per answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .decisions import Decision
from .events import InputAnsweredEvent, TurnEvent
from .messages import JsonObject


@dataclass(frozen=True, kw_only=True)
class AnswerRecord:
    """One answer, as ``session.answers()`` lists it.

    ``by`` is the verified answerer (``None``: the resume named nobody), ``source``
    the channel it came through (``None``: the resume did not say), ``at`` when it
    was stored (seconds since the epoch). ``decision`` is set when the question was
    a decision on a proposed call; ``value`` is the answer as stored either way.
    """

    session_id: str
    turn_id: str
    input_id: str
    call_id: str
    tool: str
    kind: str
    by: str | None
    source: str | None
    at: float | None
    value: Any
    decision: Decision | None
    seq: int | None

    @classmethod
    def of(cls, event: InputAnsweredEvent) -> AnswerRecord:
        decision = None
        if event.kind == "decision":
            try:
                decision = Decision.from_value(event.value)
            except ValueError:
                decision = None  # (a record is shown as it was stored)
        return cls(
            session_id=event.session_id,
            turn_id=event.turn_id,
            input_id=event.input_id,
            call_id=event.call_id,
            tool=event.tool,
            kind=event.kind,
            by=event.by,
            source=event.source,
            at=event.at,
            value=event.value,
            decision=decision,
            seq=event.seq,
        )

    def to_dict(self) -> JsonObject:
        """The record as JSON (``decision`` as its answer form, or ``None``)."""
        return {
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "input_id": self.input_id,
            "call_id": self.call_id,
            "tool": self.tool,
            "kind": self.kind,
            "by": self.by,
            "source": self.source,
            "at": self.at,
            "value": self.value,
            "decision": self.decision.to_dict() if self.decision is not None else None,
            "seq": self.seq,
        }

    def describe(self) -> str:
        """One line for people: what was decided (or answered), by whom, through what."""
        who = self.by or "someone unnamed"
        via = f" via {self.source}" if self.source else ""
        d = self.decision
        if d is None:
            return f"{self.input_id}: answered {self.value!r} by {who}{via}"
        what = {
            "approve": "approved",
            "edit": f"approved with edits {d.arguments!r}",
            "reject": "rejected" + (f" ({d.reason})" if d.reason else ""),
            "respond": f"answered instead: {d.message!r}",
        }[d.kind]
        return f"{self.tool or self.input_id}: {what} by {who}{via}"


def answer_records(events: Iterable[TurnEvent]) -> list[AnswerRecord]:
    """The answers among logged events, oldest first: every ``input.answered`` but a
    timer's (a ``ctx.sleep`` or a retry's wait ending is no one's answer)."""
    return [
        AnswerRecord.of(e)
        for e in events
        if isinstance(e, InputAnsweredEvent) and e.kind != "timer"
    ]
