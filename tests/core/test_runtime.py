"""Runtime and AgentSession: ordering, concurrency, observing, results and recovery."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from conftest import plant_open_turn
from eventually import eventually

import turnkit
from turnkit import TriggerMessage, UserMessage, tool
from turnkit.stores import SqliteStore
from turnkit.testing import RecordingSink, ScriptedModel, ScriptedReply, tool_call


def echo_agent(name: str = "a", *tools: turnkit.Tool, respond: Any = None) -> turnkit.Agent:
    def default(messages: Any) -> Any:
        return f"echo: {messages[-1].text}"

    return turnkit.Agent(name=name, model=ScriptedModel(respond=respond or default), tools=tools)


async def test_turns_on_one_session_run_in_start_order(open_runtime: Any) -> None:
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    ids = [session.start(f"m{i}") for i in range(5)]
    results = [await session.result(t) for t in reversed(ids)]
    assert [r.text for r in reversed(results)] == [f"echo: m{i}" for i in range(5)]
    texts = [m.text for m in await session.messages() if isinstance(m, UserMessage)]
    assert texts == [f"m{i}" for i in range(5)]


async def test_turns_on_different_sessions_run_concurrently(open_runtime: Any) -> None:
    arrived: dict[str, asyncio.Event] = {"s1": asyncio.Event(), "s2": asyncio.Event()}

    @tool
    async def rendezvous(ctx: turnkit.ToolContext) -> str:
        """Wait until the other session's turn is also inside this tool."""
        arrived[ctx.session_id].set()
        other = "s2" if ctx.session_id == "s1" else "s1"
        await asyncio.wait_for(arrived[other].wait(), timeout=10)
        return "met"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("rendezvous")])
        return "done"

    rt = await open_runtime(echo_agent("a", rendezvous, respond=respond))
    s1, s2 = rt.session("a", "s1"), rt.session("a", "s2")
    # Sequential sessions would deadlock here (and time out inside the tool).
    t1, t2 = s1.start("x"), s2.start("y")
    r1, r2 = await s1.result(t1), await s2.result(t2)
    assert (r1.text, r2.text) == ("done", "done")


async def test_observe_yields_the_turn_and_ends_on_its_terminal_event(open_runtime: Any) -> None:
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    tid = session.start("hello world")
    events = [e async for e in session.observe(tid)]
    assert events[0].type == "turn.started" and events[-1].type == "turn.completed"
    text = "".join(e.text for e in events if e.type == "message.delta")
    assert text == "echo: hello world"
    # Observing a finished turn without replay returns its terminal event, never hangs.
    late = [e.type async for e in session.observe(tid)]
    assert late == ["turn.completed"]


async def test_observe_with_replay_folds_logged_events_before_live_ones(
    open_runtime: Any,
) -> None:
    gate = asyncio.Event()

    @tool
    async def wait_gate() -> str:
        """Blocks until the test opens the gate."""
        await gate.wait()
        return "open"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(text="waiting", tool_calls=[tool_call("wait_gate")])
        return "through"

    rt = await open_runtime(echo_agent("a", wait_gate, respond=respond))
    session = rt.session("a", "s1")
    tid = session.start("go")

    async def requested() -> bool:
        return any(e.type == "action.requested" for e in await session.events(turn_id=tid))

    await eventually(requested, what="the tool call requested")
    attached = asyncio.Event()

    async def collect() -> list[str]:
        seen = []
        async for e in session.observe(tid, replay=True):
            seen.append(e.type)
            attached.set()
        return seen

    late = asyncio.create_task(collect())
    await attached.wait()  # the late observer has its first event: it is attached
    gate.set()
    types = await late
    structural = [t for t in types if not t.endswith(".delta")]
    assert structural == [
        "turn.started",
        "message.completed",
        "action.requested",
        "action.completed",
        "message.completed",
        "turn.completed",
    ]
    assert "message.delta" in types  # the second step's deltas arrived live


async def test_subscribe_filters_by_session_and_turn(open_runtime: Any) -> None:
    rt = await open_runtime(echo_agent())
    s1, s2 = rt.session("a", "s1"), rt.session("a", "s2")
    all_s1: list[turnkit.TurnEvent] = []
    unsubscribe = s1.subscribe(all_s1.append)
    t1 = s1.start("one")
    one_turn: list[turnkit.TurnEvent] = []
    s1.subscribe(one_turn.append, turn_id=t1)
    await s2.turn("elsewhere")
    await s1.result(t1)
    t2 = s1.start("two")
    await s1.result(t2)
    unsubscribe()
    await s1.turn("three")
    assert {e.session_id for e in all_s1} == {"s1"}
    assert {e.turn_id for e in all_s1} == {t1, t2}
    assert {e.turn_id for e in one_turn} == {t1}


async def test_subscribe_with_replay_to_a_finished_turn_gets_its_log(open_runtime: Any) -> None:
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    tid = session.start("x")
    await session.result(tid)
    got: list[str] = []
    unsubscribe = session.subscribe(lambda e: got.append(e.type), turn_id=tid, replay=True)
    await eventually(lambda: len(got) == 3, what=f"three events replayed: {got}")
    unsubscribe()
    assert got == ["turn.started", "message.completed", "turn.completed"]


async def test_subscribe_with_replay_to_a_session_gets_logged_then_live(
    open_runtime: Any,
) -> None:
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    first = session.start("old")
    await session.result(first)
    got: list[turnkit.TurnEvent] = []
    unsubscribe = session.subscribe(got.append, replay=True)
    await eventually(
        lambda: any(e.turn_id == first and e.type == "turn.completed" for e in got),
        what="the old turn replayed",
    )
    second = session.start("new")
    await session.result(second)
    await eventually(
        lambda: got and got[-1].type == "turn.completed" and got[-1].turn_id == second,
        what="the new turn's end",
    )
    unsubscribe()
    structural = [(e.turn_id, e.type) for e in got if e.seq is not None]
    assert structural == [
        (first, "turn.started"),
        (first, "message.completed"),
        (first, "turn.completed"),
        (second, "turn.started"),
        (second, "message.completed"),
        (second, "turn.completed"),
    ]
    assert [e.seq for e in got if e.seq is not None] == [1, 2, 3, 4, 5, 6]  # no duplicates
    assert any(e.type == "message.delta" and e.turn_id == second for e in got)  # live


async def test_a_subscriber_that_raises_breaks_nothing(
    open_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    good: list[str] = []

    def bad(event: turnkit.TurnEvent) -> None:
        raise RuntimeError("subscriber bug")

    session.subscribe(bad)
    session.subscribe(lambda e: good.append(e.type))
    with caplog.at_level(logging.ERROR):
        assert await session.turn("still fine") == "echo: still fine"
    assert good[-1] == "turn.completed"
    assert "subscriber bug" in caplog.text


async def test_results_and_transcripts_survive_a_new_runtime(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with turnkit.Runtime(echo_agent(), store=SqliteStore(db)) as rt:
        session = rt.session("a", "s1")
        tid = session.start("remember me")
        await session.result(tid)
    async with turnkit.Runtime(echo_agent(), store=SqliteStore(db)) as rt:
        session = rt.session("a", "s1")
        result = await session.result(tid)
        assert (result.status, result.text) == ("completed", "echo: remember me")
        assert [m.role for m in await session.messages()] == ["user", "assistant"]
        assert [(i.session_id, i.agent, i.status) for i in await rt.sessions()] == [
            ("s1", "a", "idle")
        ]
        with pytest.raises(turnkit.TurnError, match="has no turn nope"):
            await session.result("nope")


async def test_recover_replays_turns_a_dead_process_left_open(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    ran: list[str] = []

    @tool
    def step(ctx: turnkit.ToolContext) -> str:
        """Record that the step ran."""
        ran.append(ctx.turn_id)
        return "stepped"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("step")])
        return "recovered"

    # Simulate a dead process: the turn opened and committed its first model step.
    reply = turnkit.AssistantMessage(
        text="", turn_id="t1", tool_calls=(turnkit.ToolCall(id="c1", name="step"),)
    )
    await plant_open_turn(db, after=[reply])

    async with turnkit.Runtime(echo_agent("a", step, respond=respond), store=SqliteStore(db)) as rt:
        assert await rt.session("a", "s1").status() == "running"
        with pytest.raises(turnkit.TurnError, match="not running in this process"):
            await rt.session("a", "s1").result("t1")
        results = await rt.recover()
        assert [(r.turn_id, r.status, r.text) for r in results] == [
            ("t1", "completed", "recovered")
        ]
        assert ran == ["t1"]
        assert await rt.recover() == []
        assert await rt.session("a", "s1").status() == "idle"


async def test_a_new_turn_first_finishes_an_unrecovered_one(tmp_path: Path) -> None:
    """A turn a dead process left running was acknowledged: the next turn's delivery
    finishes it first (issue 28 item 9), it is never failed as interrupted."""
    db = tmp_path / "t.db"
    await plant_open_turn(db, text="lost")
    async with turnkit.Runtime(echo_agent(), store=SqliteStore(db)) as rt:
        session = rt.session("a", "s1")
        assert await session.turn("new") == "echo: new"
        old = await session.result("t1")
        assert (old.status, old.text) == ("completed", "echo: lost")
        assert await rt.recover() == []


async def test_proactive_trigger_is_stored_as_a_trigger_message(open_runtime: Any) -> None:
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    await session.turn("summarize the day", trigger=turnkit.Proactive(by="cron:daily"))
    first = (await session.messages())[0]
    assert first == TriggerMessage(text="summarize the day", turn_id=first.turn_id, by="cron:daily")


async def test_inbound_event_reaches_tools_and_survives_replay(open_runtime: Any) -> None:
    seen: list[Any] = []

    @tool
    def who(ctx: turnkit.ToolContext) -> str:
        """Who is asking."""
        seen.append(ctx.event)
        return ctx.event.user.id if ctx.event and ctx.event.user else "nobody"

    rt = await open_runtime(
        echo_agent(
            "a",
            who,
            respond=lambda m: (
                ScriptedReply(tool_calls=[tool_call("who")])
                if isinstance(m[-1], UserMessage)
                else f"you are {m[-1].result}"
            ),
        )
    )
    event = turnkit.InboundEvent(
        source="slack", text="hi", user=turnkit.User(id="U1", attested=True), raw={"secret": 1}
    )
    session = rt.session("a", "s1")
    assert await session.turn("hi", event=event) == "you are U1"
    assert seen == [event]


async def test_bad_arguments_get_clear_errors(open_runtime: Any) -> None:
    rt = await open_runtime(echo_agent())
    with pytest.raises(turnkit.ConfigurationError, match="unknown agent 'b'"):
        rt.session("b", "s1")
    session = rt.session("a", "s1")
    with pytest.raises(TypeError, match="must be a str"):
        session.start(42)  # type: ignore[arg-type]
    with pytest.raises(turnkit.ConfigurationError, match="non-empty"):
        rt.session("a", "")
    with pytest.raises(turnkit.ConfigurationError, match="not open"):
        turnkit.Runtime(echo_agent(), store=turnkit.stores.MemoryStore()).session("a", "s").start(
            "x"
        )
    with pytest.raises(turnkit.ConfigurationError, match="two agents"):
        turnkit.Runtime([echo_agent(), echo_agent()], store=turnkit.stores.MemoryStore())


async def test_a_session_keeps_its_agent(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with turnkit.Runtime([echo_agent("a"), echo_agent("b")], store=SqliteStore(db)) as rt:
        await rt.session("a", "s1").turn("hi")
        with pytest.raises(turnkit.ConfigurationError, match="belongs to agent 'a'"):
            rt.session("b", "s1")
    async with turnkit.Runtime([echo_agent("b")], store=SqliteStore(db)) as rt:
        session = rt.session("b", "s1")
        with pytest.raises(turnkit.ConfigurationError, match="belongs to agent 'a'"):
            await session.turn("hijack")
        assert [m.role for m in await session.messages()] == ["user", "assistant"]


async def test_unused_results_do_not_pile_up(open_runtime: Any) -> None:
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    first = session.start("m0")
    for i in range(1, 300):
        await session.result(session.start(f"m{i}"))
    assert len(session._futures) <= 256
    # An old turn's result is still there, read from the store.
    assert (await session.result(first)).text == "echo: m0"


async def test_runtime_exit_waits_for_queued_turns(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with turnkit.Runtime(echo_agent(), store=SqliteStore(db)) as rt:
        ids = [rt.session("a", "s1").start(f"m{i}") for i in range(3)]
    async with turnkit.Runtime(echo_agent(), store=SqliteStore(db)) as rt:
        results = [await rt.session("a", "s1").result(t) for t in ids]
    assert [r.status for r in results] == ["completed"] * 3


async def test_sink_seam_can_be_replaced(make_store: Any) -> None:
    sink = RecordingSink()
    async with turnkit.Runtime(echo_agent(), store=make_store(), sink=sink) as rt:
        await rt.session("a", "s1").turn("hi")
    assert sink.types()[-1] == "turn.completed"


async def test_wrong_kinds_of_arguments_are_named(open_runtime: Any) -> None:
    with pytest.raises(turnkit.ConfigurationError, match="store must implement"):
        turnkit.Runtime(echo_agent(), store="turnkit.db")  # type: ignore[arg-type]
    with pytest.raises(turnkit.ConfigurationError, match="sink must implement"):
        turnkit.Runtime(echo_agent(), store=turnkit.stores.MemoryStore(), sink=print)  # type: ignore[arg-type]
    with pytest.raises(turnkit.ConfigurationError, match="tools must be a list of Tool"):
        turnkit.Agent(
            name="a", model=ScriptedModel([]), tools=tool(name="t", description="x")(lambda: None)
        )  # type: ignore[arg-type]
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    with pytest.raises(TypeError, match="event must be an InboundEvent, got dict"):
        session.start("x", event={"source": "slack"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trigger must be a Proactive, got str"):
        session.start("x", trigger="cron")  # type: ignore[arg-type]
    assert await session.status() == "new"


async def test_a_later_delivery_reads_only_the_messages_committed_since(
    open_runtime: Any,
) -> None:
    rt = await open_runtime(echo_agent())
    session = rt.session("a", "s1")
    await session.turn("one")
    await session.turn("two")
    store = session._store
    asked: list[int] = []
    real_load = store.load

    async def counting_load(turn_id: str | None = None, *, from_index: int = 0) -> Any:
        asked.append(from_index)
        return await real_load(turn_id, from_index=from_index)

    store.load = counting_load  # type: ignore[method-assign]
    assert await session.turn("three") == "echo: three"
    assert asked == [4]  # the two earlier turns' four messages were not read again
    assert [m.role for m in await session.messages()] == ["user", "assistant"] * 3
    await session.reset()
    assert await session.turn("four") == "echo: four"
    assert asked[-1] == 0  # after a reset the kept transcript is dropped


async def test_two_runtimes_taking_turns_on_one_session_each_see_the_whole_transcript(
    make_store: Any,
) -> None:
    seen: list[int] = []

    def respond(messages: Any) -> str:
        seen.append(len(messages))
        return f"saw {len(messages)}"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond))
    async with (
        turnkit.Runtime(agent, store=make_store()) as one,
        turnkit.Runtime(agent, store=make_store()) as two,
    ):
        for i in range(3):
            await one.session("a", "s1").turn(f"one {i}")
            await two.session("a", "s1").turn(f"two {i}")
        await two.session("a", "s1").reset()
        await one.session("a", "s1").turn("after the other's reset")
    assert seen == [1, 3, 5, 7, 9, 11, 1]


async def test_idle_sessions_beyond_the_cache_are_dropped_and_come_back_from_the_store(
    make_store: Any,
) -> None:
    agent = echo_agent()
    async with turnkit.Runtime(agent, store=make_store(), session_cache=3) as rt:
        for i in range(10):
            assert await rt.session("a", f"s{i}").turn(f"hi {i}") == f"echo: hi {i}"
        assert rt.cached_sessions == 3
        # A dropped session is read back from the store, with everything it had.
        again = rt.session("a", "s0")
        assert [m.role for m in await again.messages()] == ["user", "assistant"]
        assert await again.turn("more") == "echo: more"
        assert rt.cached_sessions == 3


async def test_a_busy_session_is_never_dropped(make_store: Any) -> None:
    gate = asyncio.Event()

    @tool
    async def wait() -> str:
        """Waits for the test."""
        await gate.wait()
        return "through"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("wait")])
        return "done"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[wait])
    async with turnkit.Runtime(agent, store=make_store(), session_cache=0) as rt:
        busy = rt.session("a", "busy")
        tid = await busy.submit("go")
        for i in range(5):
            rt.session("a", f"other{i}")
        assert rt.session("a", "busy") is busy  # still the one running the turn
        gate.set()
        assert (await busy.result(tid)).text == "done"
        rt.session("a", "another")
        assert rt.cached_sessions == 0


def test_session_cache_must_be_a_non_negative_int() -> None:
    with pytest.raises(turnkit.ConfigurationError, match="session_cache must be 0 or more"):
        turnkit.Runtime(echo_agent(), store=turnkit.stores.MemoryStore(), session_cache=-1)
    with pytest.raises(turnkit.ConfigurationError, match="session_cache must be an int"):
        turnkit.Runtime(echo_agent(), store=turnkit.stores.MemoryStore(), session_cache="9")  # type: ignore[arg-type]
