"""Paging the session list: newest first, with an opaque cursor that survives new
sessions arriving between two pages (keyset paging on update time and id)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

from .._store import SessionInfo
from ._bodies import HttpError


def page_of_sessions(
    infos: Sequence[SessionInfo], limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``infos`` after ``cursor``, and the cursor of the next page."""
    ordered = sorted(infos, key=lambda i: (-i.updated_at, i.session_id))
    if cursor:
        after = _decode(cursor)
        ordered = [i for i in ordered if (-i.updated_at, i.session_id) > after]
    page = ordered[:limit]
    rows = [
        {"session_id": i.session_id, "status": i.status, "updated_at": i.updated_at} for i in page
    ]
    more = len(ordered) > limit
    return rows, _encode(page[-1]) if more and page else None


def _encode(info: SessionInfo) -> str:
    raw = json.dumps([info.updated_at, info.session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        updated_at, session_id = json.loads(raw)
        if not isinstance(updated_at, int | float) or not isinstance(session_id, str):
            raise ValueError
        return (-float(updated_at), session_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise HttpError(
            400, "invalid_parameter", "cursor is not one this server handed out"
        ) from None
