"""``on_thread`` and ``ToolThreads``: a def tool's hop to a thread and back, with the
caller's context, its outcome, a cancellation that comes before a thread takes the
call, and the pool's threads (reused, capped, ended)."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time
from collections.abc import Iterator

import pytest
from eventually import eventually_blocking

from turnkit.stores._off_loop import on_thread
from turnkit.stores._tool_threads import ToolThreads

who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


@pytest.fixture
def threads() -> Iterator[ToolThreads]:
    pool = ToolThreads(2, "test-tool")
    yield pool
    pool.shutdown()


async def test_the_call_runs_on_a_thread_with_the_callers_context(threads: ToolThreads) -> None:
    who.set("caller")
    loop_thread = threading.get_ident()
    thread, seen = await on_thread(threads, lambda x: (threading.get_ident(), who.get() + x), "!")
    assert thread != loop_thread and seen == "caller!"


async def test_what_the_call_raises_reaches_the_caller(threads: ToolThreads) -> None:
    def fails() -> None:
        raise LookupError("not here")

    def stops() -> None:
        raise StopIteration

    with pytest.raises(LookupError, match="not here"):
        await on_thread(threads, fails)
    with pytest.raises(RuntimeError, match="StopIteration"):
        await on_thread(threads, stops)


async def test_a_call_cancelled_before_a_thread_takes_it_never_runs() -> None:
    pool = ToolThreads(1, "test-one")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def block() -> bool:
        started.set()
        return release.wait(10)

    try:
        busy = asyncio.ensure_future(on_thread(pool, block))
        await asyncio.to_thread(started.wait, 10)
        queued = asyncio.ensure_future(on_thread(pool, ran.append, "queued"))
        await asyncio.sleep(0)  # not a wait: one step for the call to reach the busy pool
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        assert await busy is True
        await on_thread(pool, ran.append, "after")  # the thread is free again
    finally:
        pool.shutdown()
    assert ran == ["after"]


async def test_calls_one_after_another_reuse_one_thread(threads: ToolThreads) -> None:
    seen = {await on_thread(threads, threading.get_ident) for _ in range(50)}
    assert len(seen) == 1


async def test_no_more_threads_run_at_once_than_the_pool_has(threads: ToolThreads) -> None:
    lock = threading.Lock()
    running: list[int] = [0]
    most: list[int] = [0]

    def work() -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)  # not a wait: a tool that blocks (the work)
        with lock:
            running[0] -= 1
        return threading.get_ident()

    idents = await asyncio.gather(*(on_thread(threads, work) for _ in range(6)))
    assert most[0] == 2 and len(set(idents)) == 2


def test_shutdown_ends_the_idle_threads_and_refuses_new_calls() -> None:
    pool = ToolThreads(3, "test-shut")
    done = threading.Event()
    pool.submit(lambda: done.set)
    assert done.wait(10)
    mine = [t for t in threading.enumerate() if t.name.startswith("test-shut")]
    assert len(mine) == 1
    pool.shutdown()
    eventually_blocking(lambda: not mine[0].is_alive(), what="the idle thread ended", timeout=10)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: done.set)


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="max_threads >= 1"):
        ToolThreads(0, "none")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_calls_on_threads_of_its_own() -> None:
    """A child forked while the pool has an idle thread (which exists only in the
    parent) still gets its calls run."""
    pool = ToolThreads(1, "test-fork")
    done = threading.Event()
    pool.submit(lambda: done.set)
    assert done.wait(10)  # the pool now has one idle thread, here
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the call ran
        ran = threading.Event()
        pool.submit(lambda: ran.set)
        os._exit(0 if ran.wait(10) else 1)

    def ended() -> tuple[int, int] | None:
        waited, status = os.waitpid(pid, os.WNOHANG)
        return (waited, status) if waited else None

    _, status = eventually_blocking(ended, what="the forked child ended")
    pool.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0
