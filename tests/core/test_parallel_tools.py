"""The calls of one model step running together (``Agent(max_parallel_tools=…)``), on
every store: the transcript keeps the model's order, each call commits as it
finishes, a stop mid-batch reruns only what had not committed, a cancellation stops
what still runs and keeps what finished."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
from eventually import eventually

import turnkit
from turnkit import FatalToolError, Message, ToolContext, ToolMessage, UserMessage, tool
from turnkit.testing import CrashingStore, RecordingSink, ScriptedModel, ScriptedReply, tool_call

LABELS = ("a", "b", "c")


class Gates:
    """Remote tools that wait until the test opens their own gate."""

    def __init__(self, labels: Sequence[str] = LABELS) -> None:
        self.started = {label: asyncio.Event() for label in labels}
        self.open = {label: asyncio.Event() for label in labels}
        self.ran: list[str] = []
        self.stopped: list[str] = []
        self.running = 0
        self.most = 0

    def tool(self) -> turnkit.Tool:
        @tool
        async def fetch(label: str) -> str:
            """Fetches one thing, slowly."""
            self.ran.append(label)
            self.running += 1
            self.most = max(self.most, self.running)
            self.started[label].set()
            try:
                await self.open[label].wait()
            except asyncio.CancelledError:
                self.stopped.append(label)
                raise
            finally:
                self.running -= 1
            return f"fetched {label}"

        return fetch


def batch_model(calls: Sequence[tuple[str, dict[str, Any]]]) -> ScriptedModel:
    """Asks for ``calls`` in one step, then answers with the results it read, in order."""

    def respond(messages: Sequence[Message]) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call(name, args) for name, args in calls])
        results = [m.result for m in messages if isinstance(m, ToolMessage)]
        return "read: " + "; ".join(map(str, results))

    return ScriptedModel(respond=respond)


def fetches(labels: Sequence[str] = LABELS) -> list[tuple[str, dict[str, Any]]]:
    return [("fetch", {"label": label}) for label in labels]


def tool_results(messages: Sequence[Message]) -> list[tuple[str, Any, bool]]:
    return [(m.name, m.result, m.is_error) for m in messages if isinstance(m, ToolMessage)]


async def test_three_slow_remote_calls_take_about_as_long_as_one(open_runtime: Any) -> None:
    @tool
    async def lookup(key: str) -> str:
        """Looks a key up in a slow remote service."""
        await asyncio.sleep(0.3)  # not a wait: the slow service's work, what runs in parallel
        return f"value of {key}"

    model = batch_model([("lookup", {"key": k}) for k in LABELS])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[lookup]))
    started = time.perf_counter()
    text = await rt.session("a", "s1").turn("look up three")
    took = time.perf_counter() - started
    assert text == "read: value of a; value of b; value of c"
    # One after another they take 0.9 s; together about 0.3 s. The bound is generous
    # (a loaded machine), yet well under the sequential time.
    assert took < 0.75, took


async def test_results_keep_the_models_order_whatever_order_they_finish_in(
    open_runtime: Any, sink: RecordingSink
) -> None:
    gates = Gates()
    model = batch_model(fetches())
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[gates.tool()]))
    session = rt.session("a", "s1")
    tid = session.start("fetch three")
    for label in LABELS:
        await gates.started[label].wait()  # all three run at once
    for ended, label in enumerate(reversed(LABELS), start=1):  # and finish last to first

        async def finished(count: int = ended) -> bool:
            events = await session.events(turn_id=tid)
            return sum(e.type == "action.completed" for e in events) == count

        gates.open[label].set()
        await eventually(finished, what=f"call {label} finished")
    result = await session.result(tid)
    assert result.text == "read: fetched a; fetched b; fetched c"
    messages = await session.messages()
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    assert [m.call_id for m in messages if isinstance(m, ToolMessage)] == [
        c.id
        for c in messages[1].tool_calls  # type: ignore[attr-defined]
    ]
    # Each call is announced as the model step commits and completed as it finishes.
    logged = [e for e in await session.events(turn_id=tid) if e.type.startswith("action.")]
    assert [e.type for e in logged] == ["action.requested"] * 3 + ["action.completed"] * 3
    assert [e.name for e in logged[3:]] == ["fetch"] * 3  # type: ignore[attr-defined]
    assert [e.result for e in logged[3:]] == [  # type: ignore[attr-defined]
        "fetched c",
        "fetched b",
        "fetched a",
    ]
    live = [e.result for e in sink.events if e.type == "action.completed"]  # type: ignore[attr-defined]
    assert live == ["fetched c", "fetched b", "fetched a"]
    # The model's second request held the results in the order it asked for them.
    second = model.calls[1]  # type: ignore[attr-defined]
    assert tool_results(second.messages) == tool_results(messages[:5])


async def test_no_more_than_max_parallel_tools_run_at_once(open_runtime: Any) -> None:
    labels = ("a", "b", "c", "d", "e")
    gates = Gates(labels)
    model = batch_model(fetches(labels))
    agent = turnkit.Agent(name="a", model=model, tools=[gates.tool()], max_parallel_tools=2)
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    tid = session.start("fetch five")
    for label in labels:
        await gates.started[label].wait()
        gates.open[label].set()
    assert (await session.result(tid)).status == "completed"
    assert gates.most == 2
    assert gates.ran == list(labels)  # started in the model's order


async def test_one_runs_every_call_after_the_one_before(open_runtime: Any) -> None:
    gates = Gates()
    model = batch_model(fetches())
    agent = turnkit.Agent(name="a", model=model, tools=[gates.tool()], max_parallel_tools=1)
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    tid = session.start("fetch three")
    for label in LABELS:
        await gates.started[label].wait()
        await asyncio.sleep(0.02)  # not a wait: a window for a wrongly started second call
        assert gates.running == 1
        gates.open[label].set()
    assert (await session.result(tid)).status == "completed"
    assert gates.most == 1


async def test_local_calls_run_one_at_a_time_beside_the_remote_ones(open_runtime: Any) -> None:
    gates = Gates(("r",))
    inside: list[str] = []
    overlap: list[str] = []

    @tool
    def note(text: str, ctx: ToolContext) -> str:
        """Writes a note in the step's transaction."""
        if inside:
            overlap.append(text)
        inside.append(text)
        time.sleep(0.02)  # not a wait: a blocking local tool's work
        inside.remove(text)
        return f"noted {text}"

    calls = [("note", {"text": "1"}), ("fetch", {"label": "r"}), ("note", {"text": "2"})]
    model = batch_model(calls)
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[note, gates.tool()]))
    session = rt.session("a", "s1")
    tid = session.start("mixed")
    await gates.started["r"].wait()

    async def locals_done() -> bool:  # both local calls finish while the remote one waits
        events = await session.events(turn_id=tid)
        return sum(e.type == "action.completed" for e in events) == 2

    await eventually(locals_done, what="both local calls finished")
    gates.open["r"].set()
    result = await session.result(tid)
    assert result.text == "read: noted 1; fetched r; noted 2"
    assert overlap == []


async def test_cancel_stops_the_running_calls_and_keeps_the_finished_ones(
    open_runtime: Any, sink: RecordingSink
) -> None:
    gates = Gates()
    model = batch_model(fetches())
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[gates.tool()]))
    session = rt.session("a", "s1")
    tid = session.start("fetch three")
    for label in LABELS:
        await gates.started[label].wait()
    gates.open["b"].set()

    async def b_done() -> bool:
        return any(e.type == "action.completed" for e in await session.events(turn_id=tid))

    await eventually(b_done, what="call b finished")
    await session.cancel()
    result = await session.result(tid)
    assert (result.status, result.reason) == ("cancelled", "requested")
    assert sorted(gates.stopped) == ["a", "c"]  # stopped while they waited
    cancelled = {"cancelled": True, "reason": "requested"}
    assert tool_results(await session.messages()) == [
        ("fetch", cancelled, True),
        ("fetch", "fetched b", False),
        ("fetch", cancelled, True),
    ]
    completed = [e for e in await session.events(turn_id=tid) if e.type == "action.completed"]
    assert [e.result for e in completed] == ["fetched b"]  # type: ignore[attr-defined]
    assert len(model.calls) == 1  # type: ignore[attr-defined]
    # The transcript is whole: the next turn's model call reads it.
    follow = turnkit.Agent(name="b", model=ScriptedModel(["next"]))
    rt2 = await open_runtime(follow, store=rt.store)
    assert await rt2.session("b", "s2").turn("hi") == "next"


async def test_a_fatal_error_fails_the_turn_and_a_redelivery_reruns_only_what_is_owed(
    open_runtime: Any,
) -> None:
    runs: list[str] = []
    broken = [True]

    @tool
    async def fetch(label: str) -> str:
        """Fetches one thing."""
        runs.append(label)
        if label == "a" and broken[0]:
            await asyncio.sleep(0.05)  # not a wait: a slow failure, after b and c
            raise FatalToolError("the service is down")
        return f"fetched {label}"

    model = batch_model(fetches())
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[fetch]))
    session = rt.session("a", "s1")
    tid = session.start("fetch three")
    failed = await session.result(tid)
    assert failed.status == "failed" and "the service is down" in (failed.error or "")
    assert tool_results(await session.messages()) == []  # b and c wait for a
    broken[0] = False
    session.start("fetch three", turn_id=tid)
    assert (await session.result(tid)).text == "read: fetched a; fetched b; fetched c"
    assert sorted(runs) == ["a", "a", "b", "c"]


class Stop(Exception):
    """Stands in for a process dying right after a commit."""


def _stop() -> None:
    raise Stop("the process stopped")


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"], indirect=True)
async def test_a_stop_mid_batch_reruns_only_the_calls_that_had_not_committed(
    open_runtime: Any, make_store: Any
) -> None:
    runs: list[str] = []
    delays = {"a": 0.2, "b": 0.0, "c": 0.1}

    @tool
    async def fetch(label: str) -> str:
        """Fetches one thing."""
        runs.append(label)
        await asyncio.sleep(delays[label])  # not a wait: the call's duration (the scenario)
        return f"fetched {label}"

    model = batch_model(fetches())
    # Commits: the opening, the model step, then b's result: stop right after it.
    crashing = CrashingStore(make_store(), crash_at=3, when="after", on_crash=_stop)
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[fetch]), store=crashing)
    session = rt.session("a", "s1")
    tid = session.start("fetch three")
    with pytest.raises(Stop):
        await session.result(tid)
    assert tool_results(await session.messages()) == []  # b's result waits for a's
    runs.clear()
    rt2 = await open_runtime(turnkit.Agent(name="a", model=model, tools=[fetch]))
    recovered = await rt2.recover()
    assert [r.text for r in recovered] == ["read: fetched a; fetched b; fetched c"]
    assert sorted(runs) == ["a", "c"]


@pytest.mark.parametrize("store_kind", ["sqlite"], indirect=True)
async def test_a_later_turn_keeps_the_results_a_stopped_batch_committed(
    open_runtime: Any, make_store: Any
) -> None:
    """The later turn first finishes the stopped one (issue 28 item 9): the call
    whose result committed before the stop is kept, the others run again."""
    runs: list[str] = []

    @tool
    async def fetch(label: str) -> str:
        """Fetches one thing."""
        runs.append(label)
        duration = {"a": 0.2, "b": 0.0, "c": 0.1}[label]
        await asyncio.sleep(duration)  # not a wait: the call's duration (the scenario)
        return f"fetched {label}"

    model = batch_model(fetches())
    crashing = CrashingStore(make_store(), crash_at=3, when="after", on_crash=_stop)
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[fetch]), store=crashing)
    first = rt.session("a", "s1")
    with pytest.raises(Stop):
        await first.result(first.start("fetch three"))
    runs.clear()
    fresh = turnkit.Agent(
        name="a", model=ScriptedModel(["all three fetched", "fresh"]), tools=[fetch]
    )
    session = (await open_runtime(fresh)).session("a", "s1")
    assert await session.turn("never mind") == "fresh"
    a, b, c = tool_results(await session.messages())
    assert b == ("fetch", "fetched b", False)  # committed before the stop: kept
    assert (a, c) == (("fetch", "fetched a", False), ("fetch", "fetched c", False))
    assert sorted(runs) == ["a", "c"]


async def test_a_question_in_a_batch_waits_for_the_others_then_parks(open_runtime: Any) -> None:
    runs: list[str] = []

    @tool
    async def fetch(label: str, ctx: ToolContext) -> str:
        """Fetches one thing; c needs a yes first."""
        runs.append(label)
        if label == "c" and not await ctx.request_input("go-c", "Fetch c?"):
            return "skipped c"
        await asyncio.sleep(0.05)  # not a wait: the call's duration (the scenario)
        return f"fetched {label}"

    model = batch_model(fetches())
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[fetch]))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("fetch three"))
    assert parked.status == "suspended" and parked.request is not None
    assert sorted(runs) == ["a", "b", "c"]
    runs.clear()
    await session.resume(parked.turn_id, "go-c", True)
    assert (await session.result(parked.turn_id)).text == "read: fetched a; fetched b; fetched c"
    assert runs == ["c"]  # a and b committed before the park


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "4", None])
def test_max_parallel_tools_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(turnkit.ConfigurationError, match="max_parallel_tools"):
        turnkit.Agent(name="a", model=ScriptedModel(["x"]), max_parallel_tools=bad)
