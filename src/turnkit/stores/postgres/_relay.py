"""Live events between processes on one PostgreSQL database, over LISTEN/NOTIFY.

A process that runs turns publishes what other processes cannot read from the
log: its deltas, its channels' failed replies (``delivery.failed``), and a hint
each time it logged events (so a feed elsewhere reads
the log at once instead of at its next poll). Publishing only appends to a
bounded buffer; a task of its own sends the buffer every ``LINGER`` seconds as
one batch, cut into chunks under NOTIFY's payload limit, on a connection of its
own (so the batches go out, and arrive, in order, and no step commit waits on
NOTIFY's commit lock). A process that serves feeds listens on another connection,
opened at its first follower, and takes only chunks signed with the schema's relay
key (see ``_relay_wire``): a role that can merely connect can send NOTIFYs, not
forge an event or make a listener hold more than its bounds. Both are hints: what
is lost (a full buffer, a connection that dropped) only costs a follower some live
text, never an event of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ..._errors import MessageDecodeError
from ..._seams.relay import Relayed
from ..._values.events import (
    DeliveryFailedEvent,
    MessageDeltaEvent,
    ReasoningDeltaEvent,
    TurnEvent,
)
from ._listen import listen_forever
from ._relay_wire import (
    MAX_CHUNKS,
    Batch,
    Reassembler,
    delta_entry,
    encode,
    failure_entry,
    logged_entry,
    relayed_from,
)

log = logging.getLogger("turnkit.stores.postgres")

#: The channel every turnkit relay uses; payloads name the schema.
CHANNEL = "turnkit_events"
#: Seconds a publisher gathers entries before it sends them as one batch.
LINGER = 0.05
#: Entries a publisher buffers at most; past it, what comes is dropped.
BUFFER_LIMIT = 20_000
#: Most entries sent in one batch (one NOTIFY transaction).
BATCH_LIMIT = 2_000
#: Relayed deltas a follower's queue may hold before more are dropped.
FOLLOWER_LIMIT = 2_000
#: Seconds a stopping publisher takes at most to send what it still buffers.
DRAIN_TIMEOUT = 2.0
#: Seconds between two attempts to reconnect a lost connection.
_RECONNECT_DELAY = 1.0
#: Seconds between two log lines about rejected notifications.
_REJECT_LOG_INTERVAL = 60.0

Connect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]


class PgEventRelay:
    """The ``EventRelay`` of a ``PostgresStore`` on ``schema``."""

    def __init__(self, connect: Connect, schema: str) -> None:
        self._connect = connect
        self._schema = schema
        #: This relay's name in payloads: a follower skips what it sent itself.
        self.sender = uuid.uuid4().hex[:12]
        self._buffer: deque[list[Any]] = deque()
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._sending: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._listening: asyncio.Task[None] | None = None
        self._followers: dict[str, dict[int, Callable[[Relayed], None]]] = {}
        self._next_follower = 0
        self._number = 0
        #: Deltas dropped because the buffer was full (for monitoring).
        self.dropped = 0
        #: Whether the listening connection is up.
        self.listening = False
        #: Called with each batch's delay from send to receipt, in seconds.
        self.on_lag: Callable[[float], None] | None = None
        #: The schema's relay key (set when the store opens); nothing is sent or
        #: taken without it.
        self.key: bytes | None = None
        #: Notifications dropped by the listener, by reason (``forged``,
        #: ``malformed``, ``stale``), for monitoring.
        self.rejected: Counter[str] = Counter()
        self._rejects_logged = 0
        self._rejects_logged_at = float("-inf")

    # -- publishing ----------------------------------------------------------------

    def publish(self, event: TurnEvent) -> None:
        if len(self._buffer) >= BUFFER_LIMIT:
            self.dropped += 1
            return
        if isinstance(event, MessageDeltaEvent | ReasoningDeltaEvent):
            entry = delta_entry(event)
        elif isinstance(event, DeliveryFailedEvent):
            entry = failure_entry(event)
        elif event.seq is not None:
            last = self._buffer[-1] if self._buffer else None
            if last is not None and last[0] == "l" and last[1] == event.session_id:
                last[2], last[3] = event.turn_id, max(last[3], event.seq)
                return  # one hint says it for the events of one commit
            entry = logged_entry(event)
        else:
            return  # other live-only events stay in their process
        self._buffer.append(entry)
        if self._sending is None:
            self._sending = asyncio.get_running_loop().create_task(
                self._send_forever(), name=f"turnkit-{self._schema}-relay-sender"
            )
        self._wake.set()

    async def _send_forever(self) -> None:
        closing = self._closing
        try:
            while not closing.is_set():
                await self._wake.wait()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(closing.wait(), LINGER)  # gather more
                self._wake.clear()
                while self._buffer:
                    count = min(len(self._buffer), BATCH_LIMIT)
                    await self._send([self._buffer.popleft() for _ in range(count)])
        finally:
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()

    async def _send(self, entries: list[list[Any]]) -> None:
        """Send one batch; on a failure drop what is buffered (live text, stale by the
        time it could go) and pause before the next connection attempt."""
        if self.key is None:
            return  # the store is not open: nothing could be signed
        self._number += 1
        payloads = encode(self.key, self._schema, self.sender, self._number, time.time(), entries)
        if len(payloads) > MAX_CHUNKS and len(entries) > 1:
            # Over what a listener holds for one batch: send it as two.
            self._number -= 1
            half = len(entries) // 2
            await self._send(entries[:half])
            await self._send(entries[half:])
            return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await self._connect()
            # One statement, one transaction: its chunks are delivered together. The
            # chunks go as a binary array (%b): the text form escapes each one with a
            # regular expression, a worker's largest cost in sending a batch.
            await self._conn.execute(
                "SELECT pg_notify(%s, p) FROM unnest(%b::text[]) AS p", (CHANNEL, payloads)
            )
        except Exception as exc:
            log.warning("the event relay could not send (%s); dropping live events", exc)
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()
            self._buffer.clear()
            await asyncio.sleep(_RECONNECT_DELAY)

    # -- following -----------------------------------------------------------------

    def follow(self, session_id: str, callback: Callable[[Relayed], None]) -> Callable[[], None]:
        key = self._next_follower
        self._next_follower += 1
        self._followers.setdefault(session_id, {})[key] = callback
        if self._listening is None:
            self._listening = asyncio.get_running_loop().create_task(
                self._listen_forever(), name=f"turnkit-{self._schema}-relay-listener"
            )

        def unfollow() -> None:
            mine = self._followers.get(session_id)
            if mine is not None:
                mine.pop(key, None)
                if not mine:
                    del self._followers[session_id]

        return unfollow

    async def _listen_forever(self) -> None:
        await listen_forever(
            self._connect,
            (CHANNEL,),
            self._connected,
            self._set_listening,
            "the event relay's listener",
            log,
        )

    def _connected(self) -> Callable[[psycopg.Notify], None]:
        key = self.key
        # A new connection starts afresh; what it drops adds to the relay's counts.
        joined = (
            Reassembler(self._schema, self.sender, key, rejected=self.rejected)
            if key is not None
            else None
        )

        def heard(note: psycopg.Notify) -> None:
            if joined is None:
                return
            batch = joined.add(note.payload)
            if batch is not None:
                self._deliver(batch)
            self._log_rejects()

        return heard

    def _log_rejects(self) -> None:
        """One warning line now and then while notifications are being dropped."""
        total = sum(self.rejected.values())
        now = time.monotonic()
        if total > self._rejects_logged and now - self._rejects_logged_at >= _REJECT_LOG_INTERVAL:
            log.warning(
                "the event relay dropped %d notification(s) so far (%s): a role that can "
                "connect to the database is sending ones turnkit did not sign",
                total,
                ", ".join(f"{n} {why}" for why, n in sorted(self.rejected.items())),
            )
            self._rejects_logged, self._rejects_logged_at = total, now

    def _set_listening(self, up: bool) -> None:
        self.listening = up

    def _deliver(self, batch: Batch) -> None:
        if self.on_lag is not None:
            self.on_lag(max(0.0, time.time() - batch.at))
        for entry in batch.entries:
            try:
                followers = self._followers.get(entry[1])
                if not followers:
                    continue
                heard = relayed_from(entry)
            except (ValueError, TypeError, IndexError, MessageDecodeError):
                continue  # a malformed entry: skip it, keep the rest
            for callback in tuple(followers.values()):
                try:
                    callback(heard)
                except Exception:
                    log.exception("a relay follower raised; ignored")

    async def stop(self) -> None:
        """Send what is buffered (for at most ``DRAIN_TIMEOUT`` seconds: the last
        deltas of a turn that just ended are still wanted), then stop."""
        sending, self._sending = self._sending, None
        if sending is not None:
            self._closing.set()
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(sending), DRAIN_TIMEOUT)
        tasks = [t for t in (sending, self._listening) if t is not None]
        self._listening = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.listening = False
        self._buffer.clear()
        self._closing = asyncio.Event()
