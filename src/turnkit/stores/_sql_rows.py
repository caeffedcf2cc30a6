"""Row encoding shared by the SQL stores: JSON bodies as text, and turn rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json

from .._errors import StoreError
from .._values.records import TurnRecord

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


def session_page_sql(
    agent: str | None, limit: int, after: tuple[float, str] | None, *, placeholder: str
) -> tuple[str, tuple[Any, ...]]:
    """The ``session_page`` query, the same on both SQL stores but for the placeholder;
    with an agent it walks the ``(agent, updated_at DESC, session_id)`` index."""
    where: list[str] = []
    params: list[Any] = []
    if agent is not None:
        where.append(f"agent = {placeholder}")
        params.append(agent)
    if after is not None:
        where.append(
            f"(updated_at < {placeholder} OR (updated_at = {placeholder} "
            f"AND session_id > {placeholder}))"
        )
        params += [after[0], after[0], after[1]]
    sql = "SELECT session_id, agent, status, updated_at FROM turnkit_sessions"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY updated_at DESC, session_id LIMIT {placeholder}"
    return sql, (*params, limit)
