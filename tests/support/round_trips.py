"""A TCP proxy to PostgreSQL that counts network round trips, per connection.

A round trip is each time a client speaks again after the server has answered on
that connection (its first message counts too): what a pipelined request saves is
exactly these. Used by the PostgreSQL tests and by ``benchmarks/pg_wire.py``.
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

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, client: bool) -> None:
            nonlocal server_spoke
            while chunk := await src.read(65536):
                if client and server_spoke:
                    self.trips[me] += 1
                server_spoke = not client
                dst.write(chunk)
                await dst.drain()
            dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, True), pipe(up_reader, writer, False), return_exceptions=True
        )
