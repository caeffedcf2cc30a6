"""Row encoding shared by the SQL stores: JSON bodies as text, and turn rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json

from .._errors import StoreError
from .._values.records import PREVIEW_READ_CHARS, SessionInfo, TurnRecord, preview_of

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


#: The ``turnkit_sessions`` columns a session list selects (``with_previews`` adds one).
SESSION_COLUMNS = "session_id, agent, status, updated_at, owner"


def with_previews(sessions_sql: str, text_of: str) -> str:
    """``sessions_sql`` (selecting ``SESSION_COLUMNS``, ordered and limited as it
    likes) with one more column: the start of each session's first
    message's text, read by primary key for the rows it returns and no others.
    ``text_of`` is the dialect's expression for the ``text`` field of the JSON body
    ``m.body``."""
    first = (
        f"SELECT substr({text_of}, 1, {PREVIEW_READ_CHARS}) FROM turnkit_messages m "
        "WHERE m.session_id = p.session_id AND m.idx = 0"
    )
    return (
        f"SELECT p.session_id, p.agent, p.status, p.updated_at, p.owner, ({first}) "
        f"FROM ({sessions_sql}) p ORDER BY p.updated_at DESC, p.session_id"
    )


def session_info(row: Sequence[Any]) -> SessionInfo:
    """A ``SessionInfo`` from a row of a ``with_previews`` query."""
    sid, agent, status, updated_at, owner, first_text = row
    return SessionInfo(
        session_id=sid,
        agent=agent,
        status=status,
        updated_at=updated_at,
        preview=preview_of(first_text),
        owner=owner,
    )


def session_page_sql(
    agent: str | None,
    limit: int,
    after: tuple[float, str] | None,
    *,
    placeholder: str,
    text_of: str,
    owner: str | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """The ``session_page`` query, the same on both SQL stores but for the placeholder
    and the JSON expression; with an agent it walks the ``(agent, updated_at DESC,
    session_id)`` index (with an owner too, the ``(owner, agent, …)`` one), and
    previews are read for the page's rows only."""
    where: list[str] = []
    params: list[Any] = []
    if owner is not None:
        where.append(f"owner = {placeholder}")
        params.append(owner)
    if agent is not None:
        where.append(f"agent = {placeholder}")
        params.append(agent)
    if after is not None:
        where.append(
            f"(updated_at < {placeholder} OR (updated_at = {placeholder} "
            f"AND session_id > {placeholder}))"
        )
        params += [after[0], after[0], after[1]]
    sql = f"SELECT {SESSION_COLUMNS} FROM turnkit_sessions"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY updated_at DESC, session_id LIMIT {placeholder}"
    return with_previews(sql, text_of), (*params, limit)
