"""Paging the session list: newest first, with an opaque cursor that survives new
sessions arriving between two pages (keyset paging on update time and id, done by
the store's ``session_page``)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable
from typing import Any

from .._seams.store import Store
from .._values.records import SessionInfo, SessionKey
from .._values.times import rfc3339
from ._bodies import HttpError


async def page_of_sessions(
    store: Store,
    agent: str,
    limit: int,
    cursor: str | None,
    *,
    owner: str | None = None,
    keep: Callable[[SessionInfo], Awaitable[bool]] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``agent``'s sessions after ``cursor`` (``owner``'s only, if given),
    read from the store by key, one row more than asked, to know whether there is a
    next page. With ``keep``, rows it refuses are skipped: the store is read on,
    page after page, until the page is full or the sessions run out."""
    after = _decode(cursor) if cursor else None
    found: list[SessionInfo] = []
    while len(found) <= limit:
        batch = await store.session_page(agent=agent, limit=limit + 1, after=after, owner=owner)
        for info in batch:
            if keep is None or await keep(info):
                found.append(info)
        if len(batch) <= limit:
            break  # the store has no more
        after = (batch[-1].updated_at, batch[-1].session_id)
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
