"""Cancellations and runnable turns heard across processes on PostgreSQL, through
LISTEN/NOTIFY.

A process that records a cancellation sends a notification once it has committed;
every ``PostgresStore`` on the database listens on one connection of its own and
notes which turns were named, so a running turn learns of it at its next step
boundary without a round trip per step. Notifications are a hint only: one that
is lost (a listener reconnecting, a sender that died right after its commit) is
made up for by ``PostgresStore``'s bounded poll of the turn's row.

The same connection hears the workers' queue (``_pg_queue.CHANNEL``): a commit that
makes a turn runnable notifies it, and ``work`` is set for a worker to claim again
(a worker polls besides, for what no notification announces: a dead process's
sessions, freed when PostgreSQL ends its connection).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

log = logging.getLogger("turnkit.stores")

#: The channel every turnkit store listens on; payloads name the schema.
CHANNEL = "turnkit_cancel"
#: How many heard (session, turn) pairs are kept at most before the oldest go:
#: a turn that is not running here is never asked about, so its entry is only noise.
_HEARD_LIMIT = 10_000
#: Seconds between two attempts to reconnect a lost listener.
_RECONNECT_DELAY = 1.0


class CancelListener:
    """Listens on ``CHANNEL`` and remembers the turns of ``schema`` named there."""

    def __init__(
        self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]], schema: str
    ) -> None:
        #: Opens an autocommit connection of the store's (its DSN and settings).
        self._connect = connect
        self._schema = schema
        self._heard: dict[tuple[str, str], None] = {}
        self._task: asyncio.Task[None] | None = None
        #: Whether the listening connection is up (else only the poll finds cancels).
        self.listening = False
        #: Set when a turn of ``schema`` became runnable (see ``_pg_queue``).
        self.work = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._listen(), name=f"turnkit-{self._schema}-cancel-listener"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.listening = False

    def heard(self, session_id: str, turn_id: str) -> bool:
        """Whether a cancellation of the turn was announced since last asked (the
        announcement is consumed)."""
        key = (session_id, turn_id)
        if key not in self._heard:
            return False
        del self._heard[key]
        return True

    def payload(self, session_id: str, turn_id: str) -> str:
        return json.dumps([self._schema, session_id, turn_id])

    async def _listen(self) -> None:
        while True:
            try:
                conn = await self._connect()
                async with conn:
                    await conn.execute("LISTEN turnkit_cancel")  # CHANNEL
                    await conn.execute("LISTEN turnkit_queue")  # _pg_queue.CHANNEL
                    self.listening = True
                    self.work.set()  # what was announced while not listening
                    async for note in conn.notifies():
                        if note.channel == CHANNEL:
                            self._note(note.payload)
                        elif note.payload == self._schema:
                            self.work.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.listening:
                    log.warning("the cancellation listener lost its connection: %s", exc)
                self.listening = False
            await asyncio.sleep(_RECONNECT_DELAY)

    def _note(self, payload: str) -> None:
        try:
            schema, session_id, turn_id = json.loads(payload)
        except (ValueError, TypeError):
            return  # not one of ours
        if schema != self._schema or not isinstance(session_id, str):
            return
        self._heard[(session_id, str(turn_id))] = None
        while len(self._heard) > _HEARD_LIMIT:
            del self._heard[next(iter(self._heard))]


async def announce(conn: psycopg.AsyncConnection[Any], payloads: list[str]) -> None:
    """Send one notification per payload on ``CHANNEL`` (after the commit they name)."""
    for payload in payloads:
        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
