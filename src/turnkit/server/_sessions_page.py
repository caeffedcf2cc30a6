"""Paging the session list: newest first, with an opaque cursor that survives new
sessions arriving between two pages (keyset paging on update time and id, done by
the store's ``session_page``).

Under a custom ``authorize`` each row is checked after it is read, so a caller who
may see few sessions could make one request scan the whole table. The scan reads
large batches and stops after ``MAX_READS`` of them: the page then ends early
(fewer rows than asked, possibly none) with a cursor that continues the scan, and a
client keeps following ``next`` until it is ``null``.
"""

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

#: Rows one store read fetches when ``authorize`` may refuse some of them.
SCAN_BATCH = 200
#: Most store reads one request for a filtered page makes.
MAX_READS = 5


async def page_of_sessions(
    store: Store,
    agent: str,
    limit: int,
    cursor: str | None,
    *,
    owner: str | None = None,
    keep: Callable[[SessionInfo], Awaitable[bool]] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``agent``'s sessions after ``cursor`` (``owner``'s only, if given)
    and the cursor of the next (``None`` after the last). Without ``keep`` it is one
    read of ``limit + 1`` rows; with it, rows ``keep`` refuses are skipped, reading
    on in batches of ``SCAN_BATCH`` for at most ``MAX_READS`` reads."""
    after = _decode(cursor) if cursor else None
    size = limit + 1 if keep is None else max(limit + 1, SCAN_BATCH)
    found: list[SessionInfo] = []
    for _ in range(MAX_READS):
        batch = await store.session_page(agent=agent, limit=size, after=after, owner=owner)
        for info in batch:
            if keep is None or await keep(info):
                found.append(info)
                if len(found) > limit:
                    # One row more than the page: there is a next page, after its last.
                    return _rows(found[:limit]), _encode(_key(found[limit - 1]))
            after = _key(info)
        if len(batch) < size:
            return _rows(found), None  # the store has no more
    # The scan's budget is spent: this page ends here, the next goes on from here.
    return _rows(found), None if after is None else _encode(after)


def _rows(page: list[SessionInfo]) -> list[dict[str, Any]]:
    return [
        {
            "session_id": i.session_id,
            "status": i.status,
            "updated_at": rfc3339(i.updated_at),
            "preview": i.preview,
        }
        for i in page
    ]


def _key(info: SessionInfo) -> SessionKey:
    return (info.updated_at, info.session_id)


def _encode(key: SessionKey) -> str:
    raw = json.dumps(list(key)).encode()
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
