"""Writes as values: what one commit changes, made by the engine, applied by a store.

A commit is a list of these. The engine decides what they are (from the turn's
position and the rules in ``turn_rules``); a store only applies them, all or none,
in one transaction. Being values, they can be kept (a local tool's step is
written after the tool returns), logged, compared in tests, and applied by a
store nobody here wrote, without a callback into the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from .events import TurnEvent
from .messages import Message
from .records import SessionStatus, TurnRecord, TurnStatus

# The three writes every step makes (seven a model+tool pair) set their slots
# through the slots' own descriptors: a frozen dataclass's generated ``__init__``
# calls ``object.__setattr__`` once per field, which looks the field up on the class
# first (326 ns a two-field write against 201). They stay frozen all the same.


@dataclass(frozen=True, slots=True, init=False)
class AppendMessage:
    """Put ``message`` at transcript position ``index``; a taken index is an error."""

    index: int
    message: Message

    def __init__(self, index: int, message: Message) -> None:
        _set_index(self, index)
        _set_message(self, message)


@dataclass(frozen=True, slots=True, init=False)
class PutStep:
    """Memoize a step's JSON result; a step id already stored is an error."""

    step_id: str
    turn_id: str
    result: Any

    def __init__(self, step_id: str, turn_id: str, result: Any) -> None:
        _set_step_id(self, step_id)
        _set_turn_id(self, turn_id)
        _set_result(self, result)


@dataclass(frozen=True, slots=True, init=False)
class LogEvent:
    """Append a structural event; its ``seq`` is set and unused in the session."""

    event: TurnEvent

    def __init__(self, event: TurnEvent) -> None:
        _set_event(self, event)


def _setter(cls: type, name: str) -> Callable[[object, Any], None]:
    """The setter of slot ``name`` of ``cls`` (its member descriptor's own)."""
    setter: Callable[[object, Any], None] = vars(cls)[name].__set__
    return setter


_set_index = _setter(AppendMessage, "index")
_set_message = _setter(AppendMessage, "message")
_set_step_id = _setter(PutStep, "step_id")
_set_turn_id = _setter(PutStep, "turn_id")
_set_result = _setter(PutStep, "result")
_set_event = _setter(LogEvent, "event")


@dataclass(frozen=True, slots=True)
class PutTurn:
    """Put ``record`` as the turn's state if the turn's stored status is still
    ``expect`` (``None``: no turn of that id is stored yet); otherwise the commit
    fails with ``TurnMoveError`` and nothing of it is kept. The engine makes these
    with ``turn_rules.new_turn`` and ``turn_rules.move``; the store checks the
    expected status and nothing else.

    A new turn is stored whole, its place (``created_at``) given by the store (after
    every turn of the session, from the database's clock); if its session has no
    row yet, it gets one (agent ``record.agent``, ``owner``'s, status ``new``). A
    stored turn takes the record's ``status``, ``text``, ``error``, ``pending``,
    ``finished_at``, ``version`` and ``held_by``; its place, opening, event and
    cancellation stay as stored (``RequestCancel`` alone sets that).
    ``session_status``, when given, becomes the session's status, and
    ``record.agent`` its agent."""

    record: TurnRecord
    expect: TurnStatus | None
    session_status: SessionStatus | None = None
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class RequestCancel:
    """Record that the turn is to end ``cancelled``; the first reason recorded wins.
    A missing turn is an error."""

    turn_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestReset:
    """Mark the session as having a reset pending (a barrier every process reads in
    ``load``) and cancel (reason ``reset``) each unfinished turn that has no
    cancellation yet. A mark already there stays; a session never seen is left
    alone. ``ArchiveGeneration`` and ``DropReset`` clear the mark."""


@dataclass(frozen=True, slots=True)
class DropReset:
    """Clear the session's pending reset without archiving (it held nothing)."""


@dataclass(frozen=True, slots=True)
class ArchiveGeneration:
    """Reset the session: its messages, steps, events and turns move to the archive
    under ``generation``; the live tables empty, the status becomes ``new`` and the
    generation ``generation + 1``, clearing a pending reset. Turns still ``queued``
    stay live, with their steps: they run in the new generation. Refused if the live
    generation is not ``generation`` (someone else reset it first)."""

    generation: int
    agent: str


@dataclass(frozen=True, slots=True)
class EraseSession:
    """Delete everything the store keeps of the session: its messages, steps, events
    and turns, live and in every archived generation, queued turns included. What
    is left is a tombstone: the session's id, agent and owner (so the id cannot
    pass to another owner), ``by`` and when (``SessionSnapshot.erased``), and the
    last event number it used (numbering carries on after it). The status becomes
    ``new``, the generation goes up by one, a pending reset is cleared. A session
    never seen is left alone."""

    by: str | None = None


@dataclass(frozen=True, slots=True)
class DropGeneration:
    """Delete archived generation ``generation`` of the session: its messages, steps,
    events and turns, and its entry in ``generations()``. A generation that is not
    archived (the live one, or one already dropped) is left alone."""

    generation: int


@dataclass(frozen=True, slots=True)
class PruneSession:
    """Delete the session whole, its row and everything keyed by it, live and
    archived, if it was last updated before ``idle_before`` (seconds since the epoch)
    and has no turn queued, running or parked; otherwise change nothing. The check
    and the deletion are one step of the transaction, so a turn stored meanwhile by
    another process keeps the session (or, stored after, starts a new one)."""

    idle_before: float


@dataclass(frozen=True, slots=True)
class TrimEvents:
    """Cut the live event log of turn ``turn_id``, which has ended, to its last event
    (the one that says how it ended: what a redelivery re-announces, and the
    session's last event number stays where it was), and mark the turn trimmed so
    retention does not list it again. A turn not ended, or not stored, is left
    alone."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class CountUsage:
    """Add one model call's tokens and cost to the usage ledger: the session's total
    and its tenant's (see docs/tenants.md, budgets). Written in the commit of the
    model step it counts, so the ledger never counts a step that did not commit, nor
    misses one that did."""

    tenant: str
    input_tokens: int
    output_tokens: int
    cost: float


Write: TypeAlias = (
    AppendMessage
    | PutStep
    | LogEvent
    | PutTurn
    | RequestCancel
    | RequestReset
    | DropReset
    | ArchiveGeneration
    | EraseSession
    | DropGeneration
    | PruneSession
    | TrimEvents
    | CountUsage
)
