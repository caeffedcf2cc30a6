"""``wait_tool``: a tool the model calls to wait, durably, before it goes on.

"Check the build again in twenty minutes", "remind them tomorrow at 9:00": the
model calls ``wait`` with an ISO 8601 time or a number of minutes, and the turn
parks on a timer (``ctx.sleep_until``): nothing is held in memory, any worker
resumes it, and ``session.wake`` (or ``POST …/wake``) ends the wait early. A wait
longer than ``max_wait`` is refused with an error result the model reads, saying
the limit and the time now, so it can ask for less.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import Field

from .._errors import ConfigurationError
from .context import ToolContext
from .tools import Tool, tool

#: The note (``ctx.remember``) holding when a call's wait ends.
_END = "wait-until"
#: The longest wait a model may ask for unless ``max_wait`` says otherwise.
DEFAULT_MAX_WAIT = timedelta(days=7)


class WaitRefused(ValueError):
    """A wait the tool will not take (too long, no time, a time without its zone):
    the call's error result, which the model reads."""


def wait_tool(*, max_wait: timedelta = DEFAULT_MAX_WAIT, name: str = "wait") -> Tool:
    """A tool (``name``, default ``wait``) the model may call to pause the turn until
    an ISO 8601 time with its UTC offset (``until``) or for a number of ``minutes``,
    at most ``max_wait`` ahead. Its result says when it was to end and when it did
    (``woken_early`` after ``session.wake``). Give it to an agent like any tool:
    ``Agent(..., tools=[..., turnkit.wait_tool(max_wait=timedelta(days=2))])``."""
    if not isinstance(max_wait, timedelta) or max_wait <= timedelta(0):
        raise ConfigurationError(
            f"wait_tool's max_wait must be a positive timedelta, got {max_wait!r}"
        )
    limit = max_wait.total_seconds()
    described = _describe(max_wait)

    async def wait(
        ctx: ToolContext,
        until: Annotated[
            str | None,
            Field(
                description="When to go on: an ISO 8601 time with its UTC offset, "
                "e.g. 2026-05-04T09:00:00+02:00"
            ),
        ] = None,
        minutes: Annotated[
            float | None, Field(description="Or: how many minutes to wait", gt=0)
        ] = None,
    ) -> dict[str, Any]:
        # The end is fixed once, when the call is first made: a replay (after the
        # timer fires, a wake, a crash) waits for the same instant, not "minutes" on.
        at = ctx.recall(_END)
        if not isinstance(at, int | float):
            now = time.time()
            at = _target(until, minutes, now)
            if at - now > limit:
                raise WaitRefused(
                    f"that is {_describe(timedelta(seconds=at - now))} from now; this tool "
                    f"waits at most {described}. It is now {_iso(now)}."
                )
            await ctx.remember(_END, at)
        await ctx.sleep_until(datetime.fromtimestamp(at, UTC))
        ended = time.time()
        return {"waited_until": _iso(at), "now": _iso(ended), "woken_early": ended < at}

    wait.__doc__ = (
        "Pause, then go on: give `until` (an ISO 8601 time with its UTC offset) or "
        f"`minutes`. The conversation waits durably; at most {described} ahead."
    )
    return tool(name=name)(wait)


def _target(until: str | None, minutes: float | None, now: float) -> float:
    """When the wait ends, in seconds since the epoch; exactly one of the two."""
    if (until is None) == (minutes is None):
        raise WaitRefused(f"give exactly one of `until` and `minutes`. It is now {_iso(now)}.")
    if minutes is not None:
        return now + minutes * 60
    assert until is not None
    try:
        when = datetime.fromisoformat(until.strip())
    except ValueError:
        raise WaitRefused(
            f"`until` {until!r} is not an ISO 8601 time (like 2026-05-04T09:00:00+02:00). "
            f"It is now {_iso(now)}."
        ) from None
    if when.tzinfo is None:
        raise WaitRefused(
            f"`until` {until!r} has no UTC offset; add one (Z for UTC, or +02:00…). "
            f"It is now {_iso(now)}."
        )
    return when.timestamp()


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _describe(span: timedelta) -> str:
    """A span in words a model reads easily: ``7 days``, ``3 hours``, ``20 minutes``."""
    seconds = span.total_seconds()
    for unit, size in (("day", 86_400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = round(seconds / size, 1)
            shown = int(count) if count == int(count) else count
            return f"{shown} {unit}{'' if shown == 1 else 's'}"
    return f"{round(seconds)} seconds"
