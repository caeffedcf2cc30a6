"""The suite's one way to wait for something another task, thread or process does.

A test never sleeps "long enough": it names the condition it needs and waits for
it with a deadline, so a slow machine makes it slower, not flaky, and a condition
that never comes fails naming what it waited for. ``eventually`` is for async
tests; ``eventually_blocking`` for a thread or a plain test function.

Child scripts run as processes of their own import this module too: they put
``tests/support`` on ``sys.path`` first.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: The deadline of a wait that names none: generous for a loaded CI machine, far
#: below pytest-timeout's per-test limit, so a wait fails before the test is killed.
DEFAULT_TIMEOUT = 30.0

_FIRST_PAUSE = 0.002
_LONGEST_PAUSE = 0.05


class NeverHappened(AssertionError):
    """A condition did not hold before its deadline."""


#: What a wait is for: a phrase, or a function that says it when the wait fails
#: (to show a log as it is then).
What = str | Callable[[], str]


def _failure(what: What, timeout: float, last: object, error: BaseException | None) -> str:
    named = what if isinstance(what, str) else what()
    said = f"{named}: not within {timeout:g} s (last seen: {last!r})"
    return f"{said}; last error: {error!r}" if error is not None else said


def _pauses() -> Callable[[], float]:
    """Pauses between checks: short at first (most waits end within milliseconds),
    growing so that a long wait does not spin."""
    pause = _FIRST_PAUSE

    def next_pause() -> float:
        nonlocal pause
        current, pause = pause, min(pause * 2, _LONGEST_PAUSE)
        return current

    return next_pause


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    *,
    what: What,
    timeout: float = DEFAULT_TIMEOUT,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``check`` (a function or a coroutine function) until it returns a true
    value, and return that value; after ``timeout`` seconds fail naming ``what``.

    ``ignoring``: exceptions that mean "not yet" (a server still starting); any
    other exception from ``check`` fails the wait at once."""
    deadline = time.monotonic() + timeout
    pause = _pauses()
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            result = check()
            value: T = await result if inspect.isawaitable(result) else result  # type: ignore[assignment]
            error = None
        except ignoring as exc:
            value, error = None, exc  # type: ignore[assignment]
        if value:
            return value
        last = value
        if time.monotonic() >= deadline:
            raise NeverHappened(_failure(what, timeout, last, error))
        await asyncio.sleep(pause())


def eventually_blocking(
    check: Callable[[], T],
    *,
    what: What,
    timeout: float = DEFAULT_TIMEOUT,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``eventually`` for code that may block: a thread, or a test without a loop."""
    deadline = time.monotonic() + timeout
    pause = _pauses()
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value = check()
            error = None
        except ignoring as exc:
            value, error = None, exc  # type: ignore[assignment]
        if value:
            return value
        last = value
        if time.monotonic() >= deadline:
            raise NeverHappened(_failure(what, timeout, last, error))
        time.sleep(pause())
