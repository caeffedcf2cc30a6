"""A TCP proxy to PostgreSQL that counts network round trips, per connection, and
the transactions that end on them.

A round trip is each time a client speaks again after the server has answered on
that connection (its first message counts too): what a pipelined request saves is
exactly these. A transaction ends each time the server says it is ready for the
next query and idle (ReadyForQuery, status ``I``): after a COMMIT, after a statement
run on its own, and once when the connection is made. A statement is each one the
server completes (CommandComplete), BEGIN and COMMIT included. A client must not use
TLS through it (``sslmode=disable``), or no transaction or statement is counted.
Used by the PostgreSQL tests and by ``benchmarks/pg_wire.py`` and
``benchmarks/scale_out.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any


class RoundTrips:
    """Listens on a free local port and forwards each connection to ``host:port``,
    counting its round trips in ``trips`` (one entry per connection, in the order
    they were opened)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.trips: list[int] = []
        #: Transactions ended over every connection so far (see the module).
        self.transactions = 0
        #: Statements completed over every connection so far (see the module).
        self.statements = 0
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task[Any]] = set()

    @property
    def count(self) -> int:
        """Round trips over every connection so far."""
        return sum(self.trips)

    async def start(self) -> int:
        """Start listening; return the port to connect to."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening, once the proxied connections (closed by now) are done."""
        if self._serving:
            await asyncio.wait(self._serving, timeout=10)
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)
        me = len(self.trips)
        self.trips.append(0)
        server_spoke = True
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        replies = _Replies()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, client: bool) -> None:
            nonlocal server_spoke
            while chunk := await src.read(65536):
                if client and server_spoke:
                    self.trips[me] += 1
                server_spoke = not client
                if not client:
                    idle, completed = replies.read(chunk)
                    self.transactions += idle
                    self.statements += completed
                dst.write(chunk)
                await dst.drain()
            dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, True), pipe(up_reader, writer, False), return_exceptions=True
        )


class _Replies:
    """The server's side of one connection, cut into messages (a type byte, then a
    length that counts itself), to find each ReadyForQuery that says idle and each
    CommandComplete. Before the first message, the one-byte answers to a TLS or GSS
    request come alone."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._started = False
        self._sealed = False

    def read(self, chunk: bytes) -> tuple[int, int]:
        """How many idle ReadyForQuery and CommandComplete messages ``chunk`` completes."""
        if self._sealed:
            return 0, 0
        buffer = self._buffer
        buffer += chunk
        found = completed = 0
        while buffer:
            if not self._started:
                if buffer[0] == ord("N"):  # "no" to a TLS or GSS request
                    del buffer[0]
                    continue
                if buffer[0] == ord("S"):  # "yes" to TLS: nothing here can be read
                    self._sealed = True
                    buffer.clear()
                    return 0, 0
                self._started = True
            if len(buffer) < 5:
                break
            size = 1 + int.from_bytes(buffer[1:5], "big")
            if len(buffer) < size:
                break
            if buffer[0] == ord("Z") and buffer[5:6] == b"I":
                found += 1
            elif buffer[0] == ord("C"):
                completed += 1
            del buffer[:size]
        return found, completed
