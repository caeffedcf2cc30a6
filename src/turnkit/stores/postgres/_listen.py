"""Cancellations and runnable turns heard across processes on PostgreSQL, through
LISTEN/NOTIFY.

A process that records a cancellation sends a notification once it has committed;
every ``PostgresStore`` on the database listens on one connection of its own and
notes which turns were named, so a running turn learns of it at its next step
boundary without a round trip per step. Notifications are a hint only: one that
is lost (a listener reconnecting, a sender that died right after its commit) is
made up for by ``PostgresStore``'s bounded poll of the turn's row.

The same connection hears the workers' queue (``_queue.CHANNEL``): a commit that
makes a turn runnable notifies it, and ``work`` is set for a worker to claim again
(a worker polls besides, for what no notification announces: a dead process's
sessions, freed when PostgreSQL ends its connection).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, LiteralString

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
        #: Set when a turn of ``schema`` became runnable (see ``_queue``).
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
        await listen_forever(
            self._connect,
            (CHANNEL, "turnkit_queue"),  # _queue.CHANNEL
            self._connected,
            self._set_listening,
            "the cancellation listener",
            log,
        )

    def _connected(self) -> Callable[[psycopg.Notify], None]:
        self.work.set()  # what was announced while not listening
        return self._heard_note

    def _set_listening(self, up: bool) -> None:
        self.listening = up

    def _heard_note(self, note: psycopg.Notify) -> None:
        if note.channel == CHANNEL:
            self._note(note.payload)
        elif note.payload == self._schema:
            self.work.set()

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


async def listen_forever(
    connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
    channels: Sequence[LiteralString],
    connected: Callable[[], Callable[[psycopg.Notify], None]],
    set_listening: Callable[[bool], None],
    name: str,
    logger: logging.Logger,
) -> None:
    """LISTEN on ``channels`` over a connection of its own until cancelled, reopening
    a lost connection after ``_RECONNECT_DELAY`` seconds (a loss is logged once, as
    ``name``'s). Once listening, ``connected`` gives the handler of that connection's
    notifications (called fresh on each connection, so it may start from scratch)."""
    up = False
    while True:
        try:
            conn = await connect()
            async with conn:
                for channel in channels:
                    await conn.execute("LISTEN " + channel)  # our constants, never input
                up = True
                set_listening(True)
                handle = connected()
                async for note in conn.notifies():
                    handle(note)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if up:
                logger.warning("%s lost its connection: %s", name, exc)
            up = False
            set_listening(False)
        await asyncio.sleep(_RECONNECT_DELAY)


async def announce(conn: psycopg.AsyncConnection[Any], payloads: list[str]) -> None:
    """Send one notification per payload on ``CHANNEL`` (after the commit they name)."""
    for payload in payloads:
        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
