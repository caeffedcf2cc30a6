"""In-process single writer per session, shared by every backend.

The runtime already runs one session's turns one after another; this lock also
covers two runtimes in one process over the same store object. Networked stores
add a cross-process lock on top (see ``PostgresStore``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class SessionLocks:
    """One ``asyncio.Lock`` per session id, dropped again when nobody holds or waits."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(session_id, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[session_id]
            if users == 1:
                del self._locks[session_id]
            else:
                self._locks[session_id] = (lock, users - 1)

    def held(self, session_id: str) -> bool:
        entry = self._locks.get(session_id)
        return entry is not None and entry[0].locked()
