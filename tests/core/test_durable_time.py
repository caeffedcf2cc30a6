"""Durable time on every store: deadlines with their default, cancel or fail,
reminders, ``ctx.sleep`` and ``session.wake``, and what clears a clock.

Clocks far in the future are fired by calling the timer loop with a later ``now``,
so no test waits for a deadline; the loop running in the runtime is the same code.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from durable_time_support import (
    HOUR,
    asking_agent,
    calls_tool,
    ended,
    fire,
    flaky_agent,
    parked,
)
from eventually import eventually
from suite_paths import CHILDREN

import turnkit
from turnkit import Expiry, ToolContext, tool
from turnkit.stores import parked_turn
from turnkit.testing import RecordingSink, ScriptedModel


async def ended_or_parked(
    session: turnkit.AgentSession, turn_id: str, *, after: int, timeout: float = 20
) -> Any:
    """The turn's result once it has ended or parked again after ``after`` retry
    waits ended (its ``step.retry``-numbered parks)."""

    async def over_or_parked() -> bool:
        record = await session._store.turn(turn_id)
        if record is None:
            return False
        waiting = record.pending.request.id if record.pending is not None else ""
        parked = record.status == "suspended" and waiting.endswith(f":{after + 1}")
        return parked or record.status in ("completed", "failed", "cancelled")

    await eventually(over_or_parked, what=f"turn {turn_id} ended or parked", timeout=timeout)
    return await session.result(turn_id)


def types(sink: RecordingSink, turn_id: str) -> list[str]:
    return [e.type for e in sink.events if getattr(e, "turn_id", None) == turn_id]


async def test_a_deadline_resumes_with_the_default_answer_once(
    open_runtime: Any, sink: RecordingSink
) -> None:
    answers: list[Any] = []
    agent = asking_agent(answers, expires_in=timedelta(hours=1), on_expiry={"approved": False})
    runtime = await open_runtime(agent)
    session = runtime.session("a", "s1")
    result = await parked(session)
    request = result.request
    assert request is not None and request.expires_at is not None
    assert request.expires_at == pytest.approx(time.time() + HOUR, abs=60)
    stored = await parked_turn(session._store)
    assert stored is not None and stored.wake_at == request.expires_at

    assert await fire(runtime, request.expires_at - 1) == 0  # not yet
    assert await fire(runtime, request.expires_at + 5) == 1
    done = await session.result(result.turn_id)
    assert done.status == "completed", done
    assert answers == [{"approved": False}]
    assert await fire(runtime, request.expires_at + 10) == 0  # fired once
    expired = [e for e in sink.events if e.type == "input.expired"]
    assert len(expired) == 1
    assert expired[0].action == "answer" and expired[0].late_by == pytest.approx(5, abs=0.01)
    answered = [e for e in sink.events if e.type == "input.answered"]
    assert [(e.by, e.value) for e in answered] == [("deadline", {"approved": False})]
    record = await session._store.turn(result.turn_id)
    assert record is not None and record.wake_at is None


async def test_a_deadline_can_cancel_the_turn(open_runtime: Any, sink: RecordingSink) -> None:
    answers: list[Any] = []
    runtime = await open_runtime(asking_agent(answers, expires_in=HOUR, on_expiry="cancel"))
    session = runtime.session("a", "s1")
    result = await parked(session)
    assert await fire(runtime, time.time() + 2 * HOUR) == 1
    done = await session.result(result.turn_id)
    assert (done.status, done.reason) == ("cancelled", "expired")
    assert answers == []
    assert "input.expired" in types(sink, result.turn_id)
    assert await session.status() == "idle"


async def test_a_deadline_can_fail_the_turn_naming_the_question(open_runtime: Any) -> None:
    answers: list[Any] = []
    runtime = await open_runtime(asking_agent(answers, expires_in=HOUR, on_expiry="fail"))
    session = runtime.session("a", "s1")
    result = await parked(session)
    assert await fire(runtime, time.time() + 2 * HOUR) == 1
    done = await session.result(result.turn_id)
    assert done.status == "failed"
    assert "'ok'" in (done.error or "") and "deadline" in (done.error or "")
    assert answers == []


async def test_a_default_answer_that_is_a_keyword_is_given_as_an_expiry(
    open_runtime: Any,
) -> None:
    answers: list[Any] = []

    @tool
    async def pick(order_id: str, ctx: ToolContext) -> str:
        """Pick a word."""
        word = await ctx.request_input(
            "word", "A word?", expires_in=HOUR, on_expiry=Expiry(action="answer", value="cancel")
        )
        answers.append(word)
        return str(word)

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=calls_tool("pick")), tools=[pick])
    runtime = await open_runtime(agent)
    session = runtime.session("a", "s1")
    result = await parked(session)
    await fire(runtime, time.time() + 2 * HOUR)
    assert (await session.result(result.turn_id)).status == "completed"
    assert answers == ["cancel"]


async def test_reminders_come_every_period_until_the_deadline(
    open_runtime: Any, sink: RecordingSink
) -> None:
    answers: list[Any] = []
    agent = asking_agent(answers, expires_in=HOUR, on_expiry="cancel", remind_every=900)
    runtime = await open_runtime(agent)
    session = runtime.session("a", "s1")
    result = await parked(session)
    request = result.request
    assert request is not None and request.remind_at is not None and request.asked_at is not None
    asked = request.asked_at
    assert await fire(runtime, asked + 901) == 1
    assert await fire(runtime, asked + 902) == 0  # the next one is at +1800
    # Down from +1000 to +2900: one reminder for the missed ones, not two.
    assert await fire(runtime, asked + 2900) == 1
    reminders = [e for e in sink.events if e.type == "input.reminder"]
    assert [e.reminder for e in reminders] == [1, 2]
    assert all(e.prompt == "Approve o-1?" for e in reminders)
    still = await parked_turn(session._store)
    assert still is not None and still.wake_at == pytest.approx(asked + HOUR)
    assert await session.pending() is not None
    # An answer ends the reminders and the deadline.
    await session.resume(result.turn_id, "ok", {"approved": True})
    assert (await session.result(result.turn_id)).status == "completed"
    assert await fire(runtime, asked + 2 * HOUR) == 0
    assert answers == [{"approved": True}]


async def test_an_answer_cancel_or_reset_clears_the_clock(open_runtime: Any) -> None:
    answers: list[Any] = []
    runtime = await open_runtime(asking_agent(answers, expires_in=HOUR, on_expiry="fail"))
    later = time.time() + 2 * HOUR
    answered = runtime.session("a", "answered")
    result = await parked(answered)
    await answered.resume(result.turn_id, "ok", {"approved": True})
    assert (await answered.result(result.turn_id)).status == "completed"

    cancelled = runtime.session("a", "cancelled")
    result = await parked(cancelled)
    await cancelled.cancel()
    assert (await cancelled.result(result.turn_id)).status == "cancelled"

    reset = runtime.session("a", "reset")
    await parked(reset)
    await reset.reset()

    assert await fire(runtime, later) == 0
    assert answers == [{"approved": True}]


async def test_a_deadline_that_passed_while_nothing_ran_fires_at_the_next_start_late(
    make_store: Any, store_kind: str, sink: RecordingSink
) -> None:
    if store_kind == "memory":
        pytest.skip("a memory store does not outlive its runtime")
    answers: list[Any] = []
    agent = asking_agent(answers, expires_in=HOUR, on_expiry={"approved": True})
    async with turnkit.Runtime(agent, store=make_store()) as first:
        result = await parked(first.session("a", "s1"))
    async with turnkit.Runtime(agent, store=make_store(), sink=sink) as second:
        assert await fire(second, time.time() + 3 * HOUR) == 1
        done = await second.session("a", "s1").result(result.turn_id)
        assert done.status == "completed"
    (expired,) = [e for e in sink.events if e.type == "input.expired"]
    assert expired.late_by == pytest.approx(2 * HOUR, abs=120)
    assert answers == [{"approved": True}]


async def test_bad_deadline_options_fail_the_turn_naming_them(open_runtime: Any) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"expires_in": HOUR}, "on_expiry"),
        ({"on_expiry": "cancel"}, "expires_in"),
        ({"expires_in": -1, "on_expiry": "cancel"}, "expires_in"),
        ({"expires_in": "soon", "on_expiry": "cancel"}, "expires_in"),
        ({"expires_in": HOUR, "on_expiry": {"approved": "yes"}}, "schema"),
        ({"expires_in": HOUR, "on_expiry": {1, 2}}, "JSON"),
        ({"remind_every": 0}, "remind_every"),
    ]
    for n, (ask, named) in enumerate(cases):
        runtime = await open_runtime(asking_agent([], **ask))
        session = runtime.session("a", f"s{n}")
        result = await session.result(session.start("o-1"))
        assert result.status == "failed", (ask, result)
        assert named in (result.error or ""), (ask, result.error)


# -- ctx.sleep ---------------------------------------------------------------------


def sleeping_agent(done: list[str], seconds: float) -> turnkit.Agent:
    @tool
    async def later(order_id: str, ctx: ToolContext) -> str:
        """Do it after a pause."""
        await ctx.sleep(seconds)
        done.append(order_id)
        return "done"

    return turnkit.Agent(name="a", model=ScriptedModel(respond=calls_tool("later")), tools=[later])


async def test_a_short_sleep_resumes_the_turn_by_itself(
    open_runtime: Any, sink: RecordingSink
) -> None:
    done: list[str] = []
    runtime = await open_runtime(sleeping_agent(done, 0.2))
    session = runtime.session("a", "s1")
    started = time.monotonic()
    turn_id = session.start("o-1")
    first = await session.result(turn_id)
    assert first.status == "suspended" and first.request is not None
    assert first.request.kind == "timer"
    # The runtime's own timer loop resumes it; nothing in the test fires it.
    final = await ended(session, turn_id)
    assert final.status == "completed", final
    assert time.monotonic() - started >= 0.2
    assert done == ["o-1"]
    answered = [e for e in sink.events if e.type == "input.answered"]
    assert [e.by for e in answered] == ["timer"]


async def test_a_long_sleep_wakes_early_on_session_wake(open_runtime: Any) -> None:
    done: list[str] = []
    runtime = await open_runtime(sleeping_agent(done, 30 * 24 * HOUR))
    session = runtime.session("a", "s1")
    first = await session.result(session.start("o-1"))
    assert first.status == "suspended"
    assert await session.wake(by="ops") is True
    assert (await session.result(first.turn_id)).status == "completed"
    assert done == ["o-1"]
    assert await session.wake() is False  # nothing is waiting any more


async def test_a_timer_is_not_answered_like_a_question(open_runtime: Any) -> None:
    runtime = await open_runtime(sleeping_agent([], HOUR))
    session = runtime.session("a", "s1")
    first = await session.result(session.start("o-1"))
    assert first.request is not None
    with pytest.raises(turnkit.ResumeConflictError, match="wake"):
        await session.resume(first.turn_id, first.request.id, None)


async def test_sleep_until_a_past_instant_returns_after_one_park(open_runtime: Any) -> None:
    done: list[str] = []

    @tool
    async def later(order_id: str, ctx: ToolContext) -> str:
        """Do it at a time."""
        await ctx.sleep_until(datetime(2020, 1, 1, tzinfo=UTC))
        done.append(order_id)
        return "done"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=calls_tool("later")), tools=[later])
    runtime = await open_runtime(agent)
    session = runtime.session("a", "s1")
    turn_id = session.start("o-1")
    assert (await ended(session, turn_id)).status == "completed"
    assert done == ["o-1"]


# -- durable retries -----------------------------------------------------------------


async def test_a_failed_call_waits_durably_and_runs_again(
    open_runtime: Any, sink: RecordingSink
) -> None:
    calls: list[str] = []
    retry = turnkit.Retry(attempts=3, backoff=HOUR, max_backoff=9 * HOUR, on=(ConnectionError,))
    runtime = await open_runtime(flaky_agent(calls, fail=2, retry=retry))
    session = runtime.session("a", "s1")
    first = await session.result(session.start("o-1"))
    assert first.status == "suspended" and first.request is not None
    assert first.request.kind == "timer"
    assert first.request.expires_at == pytest.approx(time.time() + HOUR, abs=60)
    assert await session.pending() is not None  # parked, holding no process
    await fire(runtime, time.time() + 2 * HOUR)
    second = await ended_or_parked(session, first.turn_id, after=1)
    assert second.status == "suspended" and second.request is not None
    # The second wait doubles.
    assert second.request.expires_at == pytest.approx(time.time() + 2 * HOUR, abs=60)
    await fire(runtime, time.time() + 3 * HOUR)
    done = await ended(session, first.turn_id)
    assert done.status == "completed" and calls == ["o-1"] * 3
    retries = [e for e in sink.events if e.type == "step.retry"]
    assert [e.attempt for e in retries] == [2, 3]
    assert "attempt 1 of 3" in retries[0].error and "service down (1)" in retries[0].error


async def test_attempts_spent_give_the_model_the_error(open_runtime: Any) -> None:
    calls: list[str] = []
    retry = turnkit.Retry(attempts=2, backoff=HOUR, on=(ConnectionError,))
    runtime = await open_runtime(flaky_agent(calls, fail=5, retry=retry))
    session = runtime.session("a", "s1")
    first = await session.result(session.start("o-1"))
    await fire(runtime, time.time() + 2 * HOUR)
    done = await ended(session, first.turn_id)
    assert done.status == "completed" and "service down (2)" in (done.text or "")
    assert calls == ["o-1", "o-1"]


async def test_other_errors_are_not_retried(open_runtime: Any) -> None:
    calls: list[str] = []
    retry = turnkit.Retry(attempts=3, on=(TimeoutError,))
    runtime = await open_runtime(flaky_agent(calls, fail=1, retry=retry))
    session = runtime.session("a", "s1")
    done = await session.result(session.start("o-1"))
    assert done.status == "completed" and "service down (1)" in (done.text or "")
    assert calls == ["o-1"]


async def test_a_retryable_error_waits_its_retry_after_in_a_plain_def_tool(
    open_runtime: Any,
) -> None:
    calls: list[str] = []

    @tool
    def quote(order_id: str) -> str:
        """Quote an order from a rate-limited service."""
        calls.append(order_id)
        if len(calls) == 1:
            raise turnkit.RetryableError("rate limited", retry_after=2 * HOUR)
        return "42"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=calls_tool("quote")), tools=[quote])
    runtime = await open_runtime(agent)
    session = runtime.session("a", "s1")
    first = await session.result(session.start("o-1"))
    assert first.status == "suspended" and first.request is not None
    assert first.request.expires_at == pytest.approx(time.time() + 2 * HOUR, abs=60)
    assert await fire(runtime, time.time() + HOUR) == 0
    await fire(runtime, time.time() + 3 * HOUR)
    assert (await ended(session, first.turn_id)).text == "done: 42"


def test_retry_options_are_checked_when_declared() -> None:
    for bad, named in (
        ({"attempts": 0}, "attempts"),
        ({"attempts": "3"}, "attempts"),
        ({"backoff": -1}, "backoff"),
        ({"on": ("x",)}, "exception types"),
    ):
        with pytest.raises(turnkit.ConfigurationError, match=named):
            turnkit.Retry(**bad)
    with pytest.raises(ValueError, match="retry_after"):
        turnkit.RetryableError("x", retry_after=-1)


# -- across processes ----------------------------------------------------------------

DEADLINE_CHILD = CHILDREN / "deadline_child.py"


async def test_a_deadline_whose_process_was_killed_fires_once_in_another(
    pg_dsn: str, pg_schema: str
) -> None:
    """The process that parked the turn and led the timers is SIGKILLed before the
    deadline; two other runtimes on the store stand for the election, and the
    deadline fires exactly once, in one of them."""
    from deadline_child import deadline_agent

    from turnkit.stores import PostgresStore

    child = subprocess.Popen(
        [sys.executable, str(DEADLINE_CHILD), pg_schema, pg_dsn, "4"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)  # type: ignore[union-attr]
        assert line.startswith("parked "), line
        expires_at = float(line.split()[1])
    finally:
        child.kill()
        child.wait(timeout=30)
    ran: list[Any] = []
    runtimes = [
        turnkit.Runtime(deadline_agent(4, ran), store=PostgresStore(pg_dsn, schema=pg_schema))
        for _ in range(2)
    ]
    async with runtimes[0] as one, runtimes[1] as two:
        record = await ended(one.session("a", "s1"), "t-1", timeout=60)
        assert record.status == "completed" and record.text == "done: ship it"
        assert time.time() >= expires_at
        assert one.timers.fired + two.timers.fired == 1
    assert ran == ["ship it"]
    store = PostgresStore(pg_dsn, schema=pg_schema)
    await store.open()
    try:
        logged = [e.type for e in await store.session("s1").events(turn_id="t-1")]
    finally:
        await store.close()
    assert logged.count("input.expired") == 1 and logged.count("input.answered") == 1


async def test_a_runtime_with_timers_off_leaves_them_to_another(tmp_path: Path) -> None:
    """A one-shot command's runtime (``timers=False``) parks a sleep; the runtime
    serving the same SQLite file fires it and runs the turn on."""
    from turnkit.stores import SqliteStore

    done: list[str] = []
    agent = sleeping_agent(done, 0.3)
    db = tmp_path / "t.db"
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as serving:
        async with turnkit.Runtime(agent, store=SqliteStore(db), timers=False) as one_shot:
            assert one_shot.run_timers is False
            parked = await one_shot.session("a", "s1").result(
                one_shot.session("a", "s1").start("o-1")
            )
            assert parked.status == "suspended"
        final = await ended(serving.session("a", "s1"), parked.turn_id)
        assert final.status == "completed" and done == ["o-1"]
        assert serving.timers.fired == 1 and one_shot.timers.fired == 0
