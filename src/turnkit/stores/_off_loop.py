"""Running a local tool's step off the event loop, where the tool may block.

A ``def`` tool's step costs one hop to a thread and back, and this is that hop: the
call goes to a ``ToolThreads`` thread, which hands its outcome to the loop in one
``call_soon_threadsafe`` once it is free for the next call, without
the chain of futures ``loop.run_in_executor`` builds around every call
(``benchmarks/thread_hop.py`` times both).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ._tool_threads import ToolThreads

T = TypeVar("T")


async def on_thread(threads: ToolThreads, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on one of ``threads``, in a copy of the caller's context
    variables (as ``asyncio.to_thread`` does); its result, or what it raised.

    Cancelled before a thread takes it, ``fn`` never runs; cancelled while it runs,
    it runs to its end and its outcome is dropped (a thread cannot be stopped).
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def run() -> Callable[[], None]:
        try:
            value = context.run(fn, *args)
        except BaseException as exc:  # handed to the waiter, as run_in_executor does
            return functools.partial(_tell, loop, done, None, exc)
        return functools.partial(_tell, loop, done, value, None)

    threads.submit(run)
    try:
        return await done
    except asyncio.CancelledError:
        threads.withdraw(run)  # (not yet taken by a thread: then it never runs)
        raise


def _tell(
    loop: asyncio.AbstractEventLoop,
    done: asyncio.Future[T],
    value: T | None,
    exc: BaseException | None,
) -> None:
    """On the thread: hand ``fn``'s outcome to the loop (unless the loop is gone)."""
    # (RuntimeError: the loop closed while fn ran, so nobody waits for it any more.)
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle, done, value, exc)


def _settle(done: asyncio.Future[T], value: T | None, exc: BaseException | None) -> None:
    """On the loop: settle ``done``, unless its waiter was cancelled meanwhile."""
    if done.cancelled():
        return
    if isinstance(exc, StopIteration):  # a future cannot hold one, as a coroutine cannot
        failure = RuntimeError("a function run on a thread raised StopIteration")
        failure.__cause__ = exc
        exc = failure
    if exc is not None:
        done.set_exception(exc)
    else:
        done.set_result(value)  # type: ignore[arg-type]
