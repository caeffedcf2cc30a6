"""Elections among the processes on one PostgreSQL database, through advisory locks.

A candidate opens a connection of its own and asks, every ``interval`` seconds,
for the session-level advisory lock of the job's name; whoever gets it leads for
as long as that connection lives. PostgreSQL releases the lock when the leader's
connection ends (the process died, its host went away: as fast as the server
notices, which TCP keepalives bound), and the next candidate to ask takes over.
The leader checks its connection every ``interval`` seconds too, so a leader cut
off from the database stops acting as one within about that long.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import psycopg

from ._commit import Connect

log = logging.getLogger("turnkit.stores.postgres")

#: The first key of every election lock (the two-key form): elections never share a
#: key with the sessions' writer locks, which use the one-key form.
_ELECTION_CLASS = 0x746B  # "tk"


def election_key(schema: str, name: str) -> int:
    """The second key of ``name``'s election lock in ``schema`` (a signed int4)."""
    digest = hashlib.blake2b(f"{schema}\0{name}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


class PgElection:
    """The election for job ``name`` in ``schema``."""

    def __init__(self, connect: Connect, schema: str, name: str, *, interval: float) -> None:
        self._connect = connect
        self.name = name
        self._key = election_key(schema, name)
        self.interval = interval
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def leading(self) -> bool:
        return self._conn is not None

    async def lead(self) -> bool:
        if self._conn is not None:
            return False  # it leads already
        waited = False
        while True:
            try:
                conn = await self._connect()
            except Exception as exc:
                log.warning("election %r: cannot connect (%s); trying again", self.name, exc)
                waited = True
                await asyncio.sleep(self.interval)
                continue
            try:
                while True:
                    cur = await conn.execute(
                        "SELECT pg_try_advisory_lock(%s, %s)", (_ELECTION_CLASS, self._key)
                    )
                    row = await cur.fetchone()
                    if row is not None and row[0]:
                        self._conn = conn
                        return waited
                    waited = True
                    await asyncio.sleep(self.interval)
            except psycopg.Error as exc:
                log.warning("election %r: the connection failed (%s); trying again", self.name, exc)
                waited = True
                await conn.close()
                await asyncio.sleep(self.interval)
            except BaseException:
                await conn.close()
                raise

    async def lost(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            while True:
                await asyncio.sleep(self.interval)
                await asyncio.wait_for(conn.execute("SELECT 1"), self.interval * 5)
        except (psycopg.Error, TimeoutError) as exc:
            log.warning("election %r: lost the lead (%s)", self.name, exc)
        self._conn = None
        await conn.close()

    async def resign(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()  # the lock goes with the session
