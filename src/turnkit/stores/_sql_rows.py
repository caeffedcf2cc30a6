"""Row encoding shared by the SQL stores: JSON bodies as text, and turn rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json

from .._errors import StoreError
from .._values.records import SessionInfo, TurnRecord, preview_of

TURN_COLUMNS = (
    "session_id, turn_id, agent, status, opening, event, text, error, created_at, finished_at, "
    "pending, cancel_reason"
)


def dumps(value: Any) -> str:
    """A value as the JSON text a SQL store keeps; ``StoreError`` if it is not JSON."""
    try:
        return to_json(value).decode()
    except Exception as exc:
        raise StoreError(f"cannot store a value as JSON: {exc}") from exc


def new_turn_values(session_id: str, record: TurnRecord, now: float | None) -> tuple[Any, ...]:
    """The values of ``_sql.new_turn`` for ``record``: with the writer's time ``now``
    on SQLite, without it (``None``) on PostgreSQL, whose own clock orders the turn.
    ``record.created_at`` is not used: a node's clock never orders turns."""
    clock = () if now is None else (now,)
    return (
        session_id,
        record.turn_id,
        record.agent,
        record.status,
        dumps(record.opening),
        dumps(record.event) if record.event is not None else None,
        *clock,
        session_id,
    )


def move_values(session_id: str, record: TurnRecord, expect: str) -> tuple[Any, ...]:
    """The values of ``_sql.MOVE_TURN``: ``record``'s moving fields, then the turn's
    key and the status it must still be in."""
    pending = dumps(record.pending) if record.pending is not None else None
    return (
        record.status,
        record.text,
        record.error,
        pending,
        record.finished_at,
        session_id,
        record.turn_id,
        expect,
    )


def refused_move(session_id: str, record: TurnRecord, expect: str | None) -> str:
    """What a store says of a ``PutTurn`` it found no row for."""
    if expect is None:
        return f"session {session_id}: turn {record.turn_id} already exists"
    return (
        f"session {session_id}: turn {record.turn_id} was to move from {expect} to "
        f"{record.status}, but another process moved it first (or it does not exist)"
    )


def turn_from_row(row: Sequence[Any]) -> TurnRecord:
    """A ``TurnRecord`` from a row selected with ``TURN_COLUMNS``."""
    sid, tid, agent, status, opening, event, text, error, created, finished, pending, why = row
    return TurnRecord(
        session_id=sid,
        turn_id=tid,
        agent=agent,
        status=status,
        opening=json.loads(opening),
        event=json.loads(event) if event else None,
        text=text,
        error=error,
        created_at=created,
        finished_at=finished,
        pending=json.loads(pending) if pending else None,
        cancel_reason=why,
    )


def session_info(row: Sequence[Any]) -> SessionInfo:
    """A ``SessionInfo`` from a row of a session list (``_sql.with_previews``)."""
    sid, agent, status, updated_at, owner, first_text = row
    return SessionInfo(
        session_id=sid,
        agent=agent,
        status=status,
        updated_at=updated_at,
        preview=preview_of(first_text),
        owner=owner,
    )
