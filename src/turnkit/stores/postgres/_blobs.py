"""PostgresStore's blobs (``blobs=True``): the ``turnkit_blobs`` table, written in the
commit of the rows that refer to them and deleted in the erasure's or retention's.

A blob is text, as every payload column is: its JSON, or, sealed by the store's
codec, ``~`` and the sealed bytes in base64 (JSON never starts with ``~``).
"""

from __future__ import annotations

import binascii
import threading
from base64 import b64decode, b64encode
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql as pgsql

from ..._errors import StoreError
from .._retention_sql import GENERATION_ONLY_TURNS

PUT = (
    "INSERT INTO turnkit_blobs (session_id, turn_id, name, data) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session_id, turn_id, name) DO NOTHING"
)
ERASE = "DELETE FROM turnkit_blobs WHERE session_id = ?"
#: Parameters: session, then session, generation, generation (``GENERATION_ONLY_TURNS``).
DROP_GENERATION = (
    f"DELETE FROM turnkit_blobs WHERE session_id = ? AND turn_id IN ({GENERATION_ONLY_TURNS})"
)
#: After ``prune_session_statements``: only if the session's row went.
PRUNE = (
    "DELETE FROM turnkit_blobs WHERE session_id = ? "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_sessions r WHERE r.session_id = ?)"
)


def as_text(data: bytes) -> str:
    """A blob's stored bytes (its JSON, or NUL and sealed bytes) as the column's text."""
    if data[:1] == b"\x00":
        return "~" + b64encode(data[1:]).decode("ascii")
    return data.decode()


def as_bytes(session_id: str, name: str, text: str) -> bytes:
    """``as_text`` undone."""
    if text[:1] != "~":
        return text.encode()
    try:
        return b"\x00" + b64decode(text[1:], validate=True)
    except binascii.Error as exc:
        raise StoreError(f"session {session_id}: blob {name} is damaged: {exc}") from exc


class BlobReader:
    """Reads blobs for the store's ``Payloads``, which open payloads synchronously
    (a load resolves a reference as it parses the row): through one connection of
    its own, opened on first use, taken in turn. Only payloads over the threshold
    come here, so this read is as rare as they are."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], schema: str) -> None:
        self._connect = connect
        self._query = pgsql.SQL(
            "SELECT data FROM {}.turnkit_blobs WHERE session_id = %s AND turn_id = %s AND name = %s"
        ).format(pgsql.Identifier(schema))
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def get(self, session_id: str, turn_id: str, name: str) -> bytes | None:
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = self._connect()
                    row = self._conn.execute(self._query, (session_id, turn_id, name)).fetchone()
                    break
                except psycopg.OperationalError as exc:
                    self.close_now()
                    if attempt == 2:
                        raise StoreError(
                            f"session {session_id}: cannot read blob {name}: {exc}"
                        ) from exc
                except psycopg.Error as exc:
                    raise StoreError(
                        f"session {session_id}: cannot read blob {name}: {exc}"
                    ) from exc
        return None if row is None else as_bytes(session_id, name, str(row[0]))

    def close_now(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self.close_now()
