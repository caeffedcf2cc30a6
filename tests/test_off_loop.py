"""``on_thread``: a def tool's hop to a thread and back, with the caller's context,
its outcome, and a cancellation that comes before a thread takes the call."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from turnkit.stores._off_loop import on_thread

who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


async def test_the_call_runs_on_a_thread_with_the_callers_context() -> None:
    who.set("caller")
    loop_thread = threading.get_ident()
    with ThreadPoolExecutor(1) as pool:
        thread, seen = await on_thread(pool, lambda x: (threading.get_ident(), who.get() + x), "!")
    assert thread != loop_thread and seen == "caller!"


async def test_what_the_call_raises_reaches_the_caller() -> None:
    def fails() -> None:
        raise LookupError("not here")

    def stops() -> None:
        raise StopIteration

    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(LookupError, match="not here"):
            await on_thread(pool, fails)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await on_thread(pool, stops)


async def test_a_call_cancelled_before_a_thread_takes_it_never_runs() -> None:
    release = threading.Event()
    ran: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        busy = asyncio.ensure_future(on_thread(pool, release.wait))
        queued = asyncio.ensure_future(on_thread(pool, ran.append, "queued"))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        assert await busy is True
    assert ran == []
