"""Running the calls of one model step together: remote calls side by side, local ones
one at a time, every result committed as its own step the moment it is known.

The driver owns the scheduling only. What a call does, how its result commits and
where its message goes are the turn runner's (``BatchSteps``); the driver commits
from one coroutine, so commits never overlap and event numbers stay in order.
A cancellation stops the calls still running (what finished stays committed); a
call that asks for input lets the others finish before the turn parks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from .._values.inputs import InputRequest
from .._values.messages import ToolCall
from .._values.turns import TurnCancelled

#: How often a batch that waits on running calls looks for a cancellation (in this
#: process it is in memory; the store's answer is cheap, see ``cancel_reason``).
CANCEL_POLL = 0.05


@dataclass(frozen=True)
class Ran:
    """A remote call returned (or raised): its JSON result and error text, if any."""

    value: object
    error: str | None


@dataclass(frozen=True)
class Asked:
    """A remote call asked for input: the turn parks on ``request``."""

    request: InputRequest


Outcome: TypeAlias = Ran | Asked


class BatchSteps(Protocol):
    """What the driver needs from the turn runner."""

    def runs_remote(self, call: ToolCall) -> bool:
        """Whether the call's tool is ``async def`` (and allowed, and its input read)."""
        ...

    async def remote(self, call: ToolCall) -> Outcome:
        """Run a remote call's tool, committing nothing; a fatal error raises."""
        ...

    async def commit_remote(self, call: ToolCall, ran: Ran) -> None:
        """Commit a remote call's result as its step."""
        ...

    async def run_here(self, call: ToolCall) -> None:
        """Run and commit any other call (a local tool, an unknown or unreadable one)."""
        ...

    async def cancel_reason(self) -> str | None:
        """Why the turn is to stop, asked here or recorded in the store, if it is."""
        ...


async def run_batch(
    steps: BatchSteps, calls: Sequence[ToolCall], limit: int
) -> list[tuple[ToolCall, InputRequest]]:
    """Run ``calls`` (in the model's order) with at most ``limit`` remote ones at once;
    return the input requests the calls asked, in call order (none: all committed).

    Raises ``TurnCancelled`` once the running calls are stopped and the finished
    ones committed; a fatal tool error (``TurnFailure``) likewise after the others
    stopped."""
    remote = deque(c for c in calls if steps.runs_remote(c))
    here = deque(c for c in calls if not steps.runs_remote(c))
    order = {c.id: i for i, c in enumerate(calls)}
    running: dict[asyncio.Task[Outcome], ToolCall] = {}
    asked: list[tuple[ToolCall, InputRequest]] = []
    try:
        while True:
            reason = await steps.cancel_reason()
            if reason is not None:
                await _stop(steps, running)
                raise TurnCancelled(reason)
            while remote and len(running) < limit:
                call = remote.popleft()
                running[asyncio.ensure_future(steps.remote(call))] = call
            finished = sorted((t for t in running if t.done()), key=lambda t: order[running[t].id])
            if finished:
                for task in finished:
                    call = running.pop(task)
                    if task.exception() is not None:
                        await _stop(steps, running)
                    outcome = task.result()  # (raises a fatal tool error)
                    if isinstance(outcome, Asked):
                        asked.append((call, outcome.request))
                    else:
                        await steps.commit_remote(call, outcome)
            elif here:
                await steps.run_here(here.popleft())
            elif running:
                await asyncio.wait(running, timeout=CANCEL_POLL, return_when="FIRST_COMPLETED")
            else:
                break
    finally:
        await _abandon(running)
    asked.sort(key=lambda pair: order[pair[0].id])
    return asked


async def _stop(steps: BatchSteps, running: dict[asyncio.Task[Outcome], ToolCall]) -> None:
    """Stop the calls still running and commit those that finished meanwhile (a
    question asked is dropped: the turn is ending)."""
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    done = list(running.items())
    running.clear()
    for task, call in done:
        if task.cancelled() or task.exception() is not None:
            continue
        outcome = task.result()
        if isinstance(outcome, Ran):
            await steps.commit_remote(call, outcome)


async def _abandon(running: dict[asyncio.Task[Outcome], ToolCall]) -> None:
    """Cancel what still runs when the batch ends abnormally; nothing is committed."""
    for task in running:
        task.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.gather(*running, return_exceptions=True)
    running.clear()
