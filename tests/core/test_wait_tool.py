"""``turnkit.wait_tool``: the model waits (until a time, or for minutes) on a durable
timer, on every store; a wait past ``max_wait`` or without a usable time is an error
result the model reads; a wake ends it early. Timers far ahead are fired with a
chosen ``now``, so nothing waits for them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import turnkit
from turnkit import ToolMessage, UserMessage
from turnkit.testing import RecordingSink, ScriptedModel, ScriptedReply, tool_call

HOUR = 3600.0


def waiting_agent(arguments: dict[str, Any], **options: Any) -> turnkit.Agent:
    """Calls ``wait`` with ``arguments``, then says what the tool answered."""

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("wait", arguments)])
        assert isinstance(last, ToolMessage)
        return f"{'error' if last.is_error else 'ok'}: {last.result}"

    return turnkit.Agent(
        name="a",
        model=ScriptedModel(respond=respond),
        tools=[turnkit.wait_tool(**options)],
    )


def result_of(messages: list[turnkit.Message]) -> ToolMessage:
    (found,) = [m for m in messages if isinstance(m, ToolMessage)]
    return found


async def test_minutes_wait_on_a_timer_that_fires_at_its_time(
    open_runtime: Any, sink: RecordingSink
) -> None:
    runtime = await open_runtime(waiting_agent({"minutes": 90}))
    session = runtime.session("a", "s1")
    parked = await session.result(session.start("check again later"))
    request = parked.request
    assert parked.status == "suspended" and request is not None and request.kind == "timer"
    assert request.expires_at is not None
    assert request.expires_at == pytest.approx(datetime.now(UTC).timestamp() + 90 * 60, abs=30)
    assert await runtime.timers.fire_due(runtime.store, now=request.expires_at - 1) == 0
    assert await runtime.timers.fire_due(runtime.store, now=request.expires_at + 1) == 1
    done = await session.result(parked.turn_id)
    assert done.status == "completed", done
    result = result_of(await session.messages())
    assert not result.is_error
    # The end was fixed when the model asked; the replay after the timer did not move it.
    until = datetime.fromtimestamp(request.expires_at, UTC)
    assert result.result["waited_until"] == until.isoformat(timespec="seconds").replace(
        "+00:00", "Z"
    )
    answered = [e for e in sink.events if e.type == "input.answered"]
    assert [e.by for e in answered] == ["timer"]


async def test_until_an_iso_time_wakes_early_and_says_so(open_runtime: Any) -> None:
    when = (datetime.now(UTC) + timedelta(days=2)).astimezone(timezone(timedelta(hours=2)))
    runtime = await open_runtime(waiting_agent({"until": when.isoformat()}))
    session = runtime.session("a", "s1")
    parked = await session.result(session.start("wait until then"))
    assert parked.request is not None and parked.request.expires_at is not None
    assert parked.request.expires_at == pytest.approx(when.timestamp(), abs=1)
    assert await session.wake(by="ops")
    done = await session.result(parked.turn_id)
    assert done.status == "completed", done
    result = result_of(await session.messages())
    assert result.result["woken_early"] is True and not result.is_error


@pytest.mark.parametrize(
    ("arguments", "wanted"),
    [
        ({"minutes": 60 * 24 * 8}, "8 days from now; this tool waits at most 7 days"),
        ({"until": "2999-01-01T00:00:00Z"}, "this tool waits at most 7 days"),
        ({"until": "tomorrow at nine"}, "is not an ISO 8601 time"),
        ({"until": "2030-01-01T09:00:00"}, "has no UTC offset"),
        ({}, "give exactly one of `until` and `minutes`"),
        ({"minutes": 5, "until": "2030-01-01T09:00:00Z"}, "give exactly one"),
    ],
)
async def test_a_wait_it_will_not_take_is_an_error_the_model_reads(
    open_runtime: Any, arguments: dict[str, Any], wanted: str
) -> None:
    runtime = await open_runtime(waiting_agent(arguments))
    session = runtime.session("a", "s1")
    done = await session.result(session.start("wait"))
    assert done.status == "completed", done  # nothing parked
    result = result_of(await session.messages())
    assert result.is_error
    assert wanted in str(result.result) and "It is now " in str(result.result)
    assert done.text is not None and done.text.startswith("error: ")


async def test_max_wait_and_name_are_the_callers(open_runtime: Any) -> None:
    tool = turnkit.wait_tool(max_wait=timedelta(minutes=30), name="pause")
    assert tool.spec.name == "pause" and "at most 30 minutes" in tool.spec.description
    runtime = await open_runtime(waiting_agent({"minutes": 45}, max_wait=timedelta(hours=1)))
    session = runtime.session("a", "s1")
    parked = await session.result(session.start("wait"))
    assert parked.status == "suspended"
    refused = await open_runtime(waiting_agent({"minutes": 45}, max_wait=timedelta(minutes=30)))
    other = refused.session("a", "s2")
    done = await other.result(other.start("wait"))
    assert "at most 30 minutes" in str(result_of(await other.messages()).result)
    assert done.status == "completed"


def test_max_wait_must_be_a_positive_timedelta() -> None:
    for bad in (0, timedelta(0), timedelta(seconds=-1), "7 days"):
        with pytest.raises(turnkit.ConfigurationError, match="max_wait"):
            turnkit.wait_tool(max_wait=bad)  # type: ignore[arg-type]
