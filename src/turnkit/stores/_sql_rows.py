"""Row encoding shared by the SQL stores: JSON bodies as text, and turn rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._values.records import SessionInfo, TurnRecord, preview_of
from . import _spill as spill
from ._payloads import Dump, Payloads

TURN_COLUMNS = (
    "session_id, turn_id, agent, status, opening, event, text, error, created_at, finished_at, "
    "pending, cancel_reason, version, held_by, wake_at, tenant"
)


def new_turn_values(
    session_id: str,
    record: TurnRecord,
    now: float | None,
    payloads: Payloads,
    dump: Dump | None = None,
) -> tuple[Any, ...]:
    """The values of ``_sql.new_turn`` for ``record``: with the writer's time ``now``
    on SQLite, without it (``None``) on PostgreSQL, whose own clock orders the turn.
    ``record.created_at`` is not used: a node's clock never orders turns. ``dump`` is
    the transaction's (``Payloads.dumper``: it may spill to blobs), else ``payloads``'."""
    clock = () if now is None else (now,)
    return (
        session_id,
        record.turn_id,
        record.agent,
        record.status,
        payloads.opening(session_id, record, dump),
        payloads.event(session_id, record, dump),
        record.version,
        record.tenant,
        *clock,
        session_id,
    )


def move_values(
    session_id: str,
    record: TurnRecord,
    expect: str,
    payloads: Payloads,
    dump: Dump | None = None,
) -> tuple[Any, ...]:
    """The values of ``_sql.MOVE_TURN``: ``record``'s moving fields, then the turn's
    key and the status it must still be in (``dump`` as for ``new_turn_values``)."""
    return (
        record.status,
        payloads.dump_text(session_id, "text", record.text),
        payloads.dump_text(session_id, "error", record.error),
        payloads.pending(session_id, record, dump),
        record.finished_at,
        record.version,
        record.held_by,
        record.wake_at,
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


#: How a first message's column starts when it is a blob's reference (its JSON text),
#: which the SQL stores' preview expressions pass through whole.
REF_TEXT = '"\\u0000~'


def session_info(row: Sequence[Any], payloads: Payloads | None = None) -> SessionInfo:
    """A ``SessionInfo`` from a row of a session list (``_sql.with_previews``); with a
    codec (``payloads``), its last column is the first message's whole stored body,
    and without one it is the text, or a blob's reference whole (``REF_TEXT``)."""
    sid, agent, status, updated_at, owner, first_text = row
    if payloads is not None and first_text is not None:
        first_text = payloads.first_text(sid, first_text)
    elif isinstance(first_text, str) and first_text.startswith(REF_TEXT):
        first_text = spill.head_of_stored(first_text)
    return SessionInfo(
        session_id=sid,
        agent=agent,
        status=status,
        updated_at=updated_at,
        preview=preview_of(first_text),
        owner=owner,
    )
