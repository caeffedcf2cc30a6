"""A session's queue keeps deliveries and resets in the order they were asked for,
and a parked turn that a cancel or a reset ends is closed by one path — on every
store for the runtime-level cases."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import turnkit
from turnkit import ToolContext, tool
from turnkit._runtime.session_queue import DeliverJob, Job, ResetJob, SessionQueue
from turnkit._values.messages import UserMessage
from turnkit._values.turns import ResetResult, TurnRequest, TurnResult
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def delivery(turn_id: str) -> DeliverJob:
    request = TurnRequest(turn_id=turn_id, opening=UserMessage(text=turn_id, turn_id=turn_id))
    future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
    return DeliverJob(request, future)


def reset_job() -> ResetJob:
    future: asyncio.Future[ResetResult] = asyncio.get_running_loop().create_future()
    return ResetJob(since=0, future=future)


def drained(queue: SessionQueue) -> list[Job]:
    jobs = []
    while (job := queue.pop()) is not None:
        jobs.append(job)
    return jobs


async def test_deliver_reset_deliver_keeps_its_order() -> None:
    queue = SessionQueue()
    first, reset, second = delivery("t1"), reset_job(), delivery("t2")
    assert queue.put(first) is True
    assert queue.hold() is True  # the reset records its barrier ...
    assert queue.put(second) is False  # ... and a turn started meanwhile waits behind it
    assert queue.put(reset, ahead=True) is True
    assert not queue.idle
    queue.release()
    assert drained(queue) == [first, reset, second]
    assert queue.idle


async def test_a_second_reset_queues_behind_the_first_and_a_closed_park_goes_ahead() -> None:
    queue = SessionQueue()
    first_reset, second_reset = reset_job(), reset_job()
    waiting, closing = delivery("later"), delivery("parked")
    assert queue.hold() is True
    assert queue.hold() is False  # overlapping: the first reset releases both
    assert queue.put(waiting) is False
    assert queue.put(closing, ahead=True) is True  # a parked turn the reset cancels
    assert queue.put(first_reset, ahead=True) is True
    assert queue.put(second_reset) is False
    queue.release()
    assert drained(queue) == [closing, first_reset, waiting, second_reset]


async def test_requests_are_the_running_delivery_then_the_queued_ones() -> None:
    queue = SessionQueue()
    running, queued = delivery("now"), delivery("next")
    queue.put(reset_job())
    queue.put(queued)
    queue.current = running.request
    assert [r.turn_id for r in queue.requests()] == ["now", "next"]
    queue.current = None
    assert [r.turn_id for r in queue.requests()] == ["next"]


def asking_agent() -> turnkit.Agent:
    @tool
    async def ask(ctx: ToolContext) -> str:
        """Asks a person."""
        return str(await ctx.request_input("ok", "ok?"))

    model = ScriptedModel(
        respond=lambda m: (
            ScriptedReply(tool_calls=[tool_call("ask")]) if m[-1].role == "user" else "done"
        )
    )
    return turnkit.Agent(name="a", model=model, tools=[ask])


@pytest.mark.parametrize("ending", ["cancel", "reset"])
async def test_a_parked_turn_is_closed_as_cancelled_by_a_cancel_or_a_reset(
    open_runtime: Any, ending: str
) -> None:
    rt = await open_runtime(asking_agent())
    session = rt.session("a", "s1")
    parked = await session.result(session.start("go"))
    assert parked.status == "suspended"
    if ending == "cancel":
        assert await session.cancel("no longer needed") == [parked.turn_id]
    else:
        await session.reset()
    closed = await session.result(parked.turn_id)
    assert (closed.status, closed.reason) == (
        "cancelled",
        "no longer needed" if ending == "cancel" else "reset",
    )
    after = await session.result(session.start("again"))
    assert after.status == "suspended"  # the session takes turns again
