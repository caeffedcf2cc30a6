"""The threads a store runs blocking calls on (a ``def`` tool's step, above all).

A hop to a thread and back is a ``def`` tool's one unavoidable cost over an
``async`` one, so the pool is built to make it cheap: a call goes straight to the
thread that went idle last (its caches are warm; the others stay asleep), each
idle thread waits on a lock of its own, and a thread is back on the idle stack
before it hands its outcome to the loop. Not ``ThreadPoolExecutor``: its thread
sets a ``Future`` and releases a semaphore after the call's outcome has woken the
loop, so the loop wakes to a GIL still held, and a call made before that thread
has called itself idle starts a second thread, so calls alternate between two
(``benchmarks/thread_hop.py`` times both).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable

#: What a job returns: how it hands its outcome back, run once its thread is idle.
Hand = Callable[[], None]
#: A call to run on a thread.
Job = Callable[[], Hand]


class _Thread:
    """One thread of the pool: asleep on ``wake`` while idle, handed ``job``."""

    __slots__ = ("job", "wake")

    def __init__(self, job: Job) -> None:
        self.job: Job | None = job
        self.wake = threading.Lock()
        self.wake.acquire()  # held: ``acquire`` blocks until a job (or the end) is handed over


class ToolThreads:
    """Up to ``max_threads`` daemon threads, started as calls need them and kept
    idle afterwards; a call made while all are busy waits for the first to finish.

    The threads are daemons: a process exiting does not wait for a tool that still
    blocks, as a crash would not (its step was never committed).
    """

    def __init__(self, max_threads: int, name: str) -> None:
        if max_threads < 1:
            raise ValueError(f"ToolThreads needs max_threads >= 1, got {max_threads}")
        self.max_threads = max_threads
        self.name = name
        self._mutex = threading.Lock()
        self._idle: list[_Thread] = []  # the last one idle on top
        self._waiting: deque[Job] = deque()  # calls made while every thread was busy
        self._started = 0
        self._closed = False
        _POOLS.add(self)

    def submit(self, job: Job) -> None:
        """Run ``job()`` on a thread: an idle one, a new one, or the first to be free,
        then, once that thread is idle again, what ``job`` returned (its hand-back to
        the caller). Neither may raise (what they raise is lost, as in a thread's
        target)."""
        with self._mutex:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot run a call after shutdown")
            if self._idle:
                thread = self._idle.pop()
                thread.job = job
                thread.wake.release()
                return
            if self._started >= self.max_threads:
                self._waiting.append(job)
                return
            self._started += 1
            number = self._started
        thread = _Thread(job)
        threading.Thread(
            target=self._serve, args=(thread,), name=f"{self.name}_{number}", daemon=True
        ).start()

    def withdraw(self, job: Job) -> bool:
        """Take back ``job`` if no thread has taken it yet (then it never runs)."""
        with self._mutex:
            try:
                self._waiting.remove(job)
            except ValueError:
                return False
            return True

    def shutdown(self) -> None:
        """Drop the calls still waiting and let every thread end: idle ones now, busy
        ones when their call returns (a blocked call is not waited for)."""
        with self._mutex:
            self._closed = True
            self._waiting.clear()
            idle, self._idle = self._idle, []
        for thread in idle:
            thread.job = None
            thread.wake.release()

    def _forget_threads(self) -> None:
        """In a forked child: the parent's threads are not here; start afresh."""
        self._mutex = threading.Lock()
        self._idle = []
        self._waiting.clear()
        self._started = 0

    def _serve(self, thread: _Thread) -> None:
        job = thread.job
        while job is not None:
            tell = job()
            with self._mutex:
                if self._waiting:
                    job = self._waiting.popleft()
                elif self._closed:
                    job = None
                else:
                    thread.job = None
                    self._idle.append(thread)
                    job = _IDLE
            # Idle before the caller is told: the loop, woken by it, finds this
            # thread free for its next call instead of starting another.
            tell()
            if job is _IDLE:
                thread.wake.acquire()  # until submit or shutdown hands over
                job = thread.job


def _idle() -> Hand:
    raise AssertionError("never run: marks a thread gone idle")


_IDLE: Job = _idle


#: Every pool of the process, so a forked child can forget the threads it lacks
#: (it would otherwise hand its calls to idle threads that exist only in the parent).
_POOLS: weakref.WeakSet[ToolThreads] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._forget_threads()


if hasattr(os, "register_at_fork"):  # (not on Windows, which cannot fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)
