"""Streaming responses: a turn's events or a session feed as ``text/event-stream``.

Both send a keep-alive comment after a quiet spell, and both stop following (but
never stop the turn) when the client goes away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

from .._errors import TurnError
from .._runtime.observe import TurnStream
from ._feed import EventFeed
from ._sse import KEEPALIVE, event_frame, frame, json_line

log = logging.getLogger("turnkit.server")

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event_stream(stream: TurnStream, idle: float) -> StreamingResponse:
    """One delivery's events, ending after its terminal event or ``input.requested``."""
    return StreamingResponse(
        _turn_frames(stream, idle), media_type="text/event-stream", headers=HEADERS
    )


def feed_stream(feed: EventFeed, idle: float, poll: float | None) -> StreamingResponse:
    """A session's (or one turn's) logged events after a point, then the live ones."""
    return StreamingResponse(
        _feed_frames(feed, idle, poll), media_type="text/event-stream", headers=HEADERS
    )


async def _feed_frames(feed: EventFeed, idle: float, poll: float | None) -> AsyncIterator[bytes]:
    events = feed.events(idle=idle, poll=poll)
    try:
        async for event in events:
            yield KEEPALIVE if event is None else event_frame(event)
    finally:
        await events.aclose()


_END = object()


async def _turn_frames(stream: TurnStream, idle: float) -> AsyncIterator[bytes]:
    """The stream's frames; a helper task reads the stream so that waiting for the
    next event can time out (for a keep-alive) without cancelling the stream."""
    queue: asyncio.Queue[object] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for event in stream:
                queue.put_nowait(event)
        except TurnError as exc:
            queue.put_nowait(exc)
        except Exception as exc:
            # The delivery broke with something else (a bug, an unwrapped driver error):
            # the client still hears that the stream ends on an error, not a mere close.
            log.error("following turn %s failed", stream.turn_id, exc_info=exc)
            queue.put_nowait(TurnError(f"turn {stream.turn_id} delivery failed: {exc!r}"))
        finally:
            queue.put_nowait(_END)

    reader = asyncio.create_task(pump())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=idle)
            except TimeoutError:
                yield KEEPALIVE
                continue
            if item is _END:
                return
            if isinstance(item, TurnError):
                yield frame(json_line({"error": str(item)}), event="error")
                continue
            yield event_frame(item)  # type: ignore[arg-type]
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await stream.aclose()
