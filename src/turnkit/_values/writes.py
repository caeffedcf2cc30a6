"""Writes as values: what one commit changes, made by the engine, applied by a store.

A commit is a list of these. The engine decides what they are (from the turn's
position and the rules in ``turn_rules``); a store only applies them, all or none,
in one transaction. Being values, they can be kept (a local tool's step is
written after the tool returns), logged, compared in tests, and applied by a
store nobody here wrote, without a callback into the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from .events import TurnEvent
from .messages import JsonObject, Message
from .records import TurnRecord, TurnStatus


@dataclass(frozen=True, slots=True)
class AppendMessage:
    """Put ``message`` at transcript position ``index``; a taken index is an error."""

    index: int
    message: Message


@dataclass(frozen=True, slots=True)
class PutStep:
    """Memoize a step's JSON result; a step id already stored is an error."""

    step_id: str
    turn_id: str
    result: Any


@dataclass(frozen=True, slots=True)
class LogEvent:
    """Append a structural event; its ``seq`` is set and unused in the session."""

    event: TurnEvent


@dataclass(frozen=True, slots=True)
class QueueTurn:
    """Record a submitted turn as ``queued`` (the transcript is not touched). A
    session seen for the first time is created (status ``new``, agent
    ``record.agent``, ``owner``'s); an existing one keeps its status and owner. The
    store, not the caller, gives the turn its place (``created_at``): after every
    turn of the session, from the database's clock. A turn id taken is an error."""

    record: TurnRecord
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class OpenTurn:
    """Record a new running turn, or move the queued turn of that id to running
    (keeping its place and any cancellation), and mark the session ``running`` for
    ``record.agent``. A session this creates is ``owner``'s. A turn id taken by a
    turn that is not queued is an error."""

    record: TurnRecord
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class SettleQueued:
    """End a ``queued`` turn that will never open (``cancelled`` with ``reason``, or
    ``failed`` with ``error``), leaving the session's status alone. A turn that is
    not queued is an error."""

    turn_id: str
    status: TurnStatus
    reason: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SetTurnStatus:
    """Move a turn to ``status``, and its session to ``session_status_after(status)``.
    ``pending`` is the checkpoint a ``suspended`` turn keeps (any other status
    clears it); a terminal status stamps ``finished_at``. A missing turn is an error."""

    turn_id: str
    status: TurnStatus
    text: str | None = None
    error: str | None = None
    pending: JsonObject | None = None


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


Write: TypeAlias = (
    AppendMessage
    | PutStep
    | LogEvent
    | QueueTurn
    | OpenTurn
    | SettleQueued
    | SetTurnStatus
    | RequestCancel
    | RequestReset
    | DropReset
    | ArchiveGeneration
)
