"""Paging the session list: newest first, with an opaque cursor that survives new
sessions arriving between two pages (keyset paging on update time and id, done by
the store's ``session_page``)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from .._seams.store import Store
from .._values.records import SessionInfo, SessionKey
from .._values.times import rfc3339
from ._bodies import HttpError


async def page_of_sessions(
    store: Store, agent: str, limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``agent``'s sessions after ``cursor``, read from the store by key
    (one row more than asked, to know whether there is a next page)."""
    after = _decode(cursor) if cursor else None
    found = await store.session_page(agent=agent, limit=limit + 1, after=after)
    page = found[:limit]
    rows = [
        {
            "session_id": i.session_id,
            "status": i.status,
            "updated_at": rfc3339(i.updated_at),
            "preview": i.preview,
        }
        for i in page
    ]
    return rows, _encode(page[-1]) if len(found) > limit else None


def _encode(info: SessionInfo) -> str:
    raw = json.dumps([info.updated_at, info.session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str) -> SessionKey:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        updated_at, session_id = json.loads(raw)
        if not isinstance(updated_at, int | float) or not isinstance(session_id, str):
            raise ValueError
        return (float(updated_at), session_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise HttpError(
            400, "invalid_parameter", "cursor is not one this server handed out"
        ) from None
