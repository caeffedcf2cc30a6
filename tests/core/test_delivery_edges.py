"""How deliveries end when things go wrong: observers never hang, results never lie."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import plant_open_turn
from eventually import eventually

import turnkit
from turnkit import StoreError, ToolMessage, UserMessage, tool
from turnkit._values import turn_rules
from turnkit._values.records import TurnRecord
from turnkit.stores import SqliteStore
from turnkit.testing import CrashingStore, RecordingSink, ScriptedModel, ScriptedReply, tool_call

HANG_GUARD = 20  # seconds; only keeps a broken build from hanging the suite


class Meltdown(BaseException):
    """Something a tool can raise that is not an ``Exception``."""


@tool
def melt() -> None:
    """Raises something that is not an Exception."""
    raise Meltdown()


def echo() -> turnkit.Agent:
    return turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: f"echo: {m[-1].text}"))


async def collect(session: turnkit.AgentSession, turn_id: str, **kw: Any) -> list[str]:
    async def run() -> list[str]:
        return [e.type async for e in session.observe(turn_id, **kw)]

    return await asyncio.wait_for(run(), HANG_GUARD)


async def test_observing_a_redelivered_completed_turn_ends(open_runtime: Any) -> None:
    rt = await open_runtime(echo())
    session = rt.session("a", "s1")
    tid = session.start("hi")
    await session.result(tid)
    session.start("hi", turn_id=tid)
    assert await collect(session, tid) == ["turn.completed"]


async def test_a_delivery_the_store_breaks_ends_observers_and_stays_open(tmp_path: Path) -> None:
    def outage() -> None:
        raise StoreError("disk unplugged")

    store = CrashingStore(SqliteStore(tmp_path / "t.db"), crash_at=2, on_crash=outage)
    async with turnkit.Runtime(echo(), store=store) as rt:
        session = rt.session("a", "s1")
        tid = session.start("hi")
        types = await collect(session, tid)
        assert types[0] == "turn.started" and types[-1] == "turn.failed"
        with pytest.raises(StoreError, match="disk unplugged"):
            await session.result(tid)
        # Nothing was marked failed: the turn is still open and recovers once the store is back.
        store.crash_at = None
        assert [r.text for r in await rt.recover()] == ["echo: hi"]


async def test_a_turn_left_running_is_finished_and_logs_its_end(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    await plant_open_turn(db, text="lost")
    async with turnkit.Runtime(echo(), store=SqliteStore(db)) as rt:
        session = rt.session("a", "s1")
        await session.turn("new")
        assert (await collect(session, "t1", replay=True))[-1] == "turn.completed"


async def test_replay_during_a_retry_does_not_stop_at_the_old_failure(open_runtime: Any) -> None:
    gate = asyncio.Event()
    calls = 0

    class Flaky:
        async def stream(self, messages: Any, tools: Any, *, system: str | None) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("provider down")
            await gate.wait()
            yield turnkit.ModelDone(reply=turnkit.ModelReply(text="back"))

    rt = await open_runtime(turnkit.Agent(name="a", model=Flaky()))
    session = rt.session("a", "s1")
    tid = session.start("hi")
    assert (await session.result(tid)).status == "failed"
    session.start("hi", turn_id=tid)
    watching = session.observe(tid, replay=True)
    first = await anext(watching)  # the retry's start, not the old failure
    await eventually(lambda: calls == 2, what="the retry at the model")
    assert first.type == "turn.started"
    gate.set()
    rest = [e.type async for e in watching]
    assert rest == ["message.completed", "turn.completed"]


async def test_closing_the_runtime_settles_every_result_and_observer(tmp_path: Path) -> None:
    forever, reached = asyncio.Event(), asyncio.Event()

    @tool
    async def wait_forever() -> None:
        """Never returns."""
        reached.set()
        await forever.wait()

    def respond(messages: Any) -> Any:
        return ScriptedReply(tool_calls=[tool_call("wait_forever")])

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[wait_forever])
    with pytest.raises(RuntimeError, match="app crashed"):
        async with turnkit.Runtime(agent, store=SqliteStore(tmp_path / "t.db")) as rt:
            session = rt.session("a", "s1")
            running, queued = session.start("one"), session.start("two")
            attached = asyncio.Event()

            async def watch() -> list[str]:
                seen = []
                async for e in session.observe(running):
                    seen.append(e.type)
                    attached.set()
                return seen

            watcher = asyncio.create_task(watch())
            await attached.wait()
            await eventually(lambda: reached.is_set(), what="the turn in its tool")
            raise RuntimeError("app crashed")
    with pytest.raises(turnkit.TurnError, match="interrupted"):
        await session.result(running)
    with pytest.raises(turnkit.TurnError, match="never stored"):
        await session.result(queued)
    # The observer was told, live, that this delivery ended and left the turn open.
    seen = await watcher
    assert seen[-1] == "turn.failed"


async def test_a_base_exception_from_a_tool_fails_only_that_delivery(open_runtime: Any) -> None:
    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage) and messages[-1].text == "melt":
            return ScriptedReply(tool_calls=[tool_call("melt")])
        return "fine"

    rt = await open_runtime(
        turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[melt])
    )
    session = rt.session("a", "s1")
    bad = session.start("melt")
    assert await session.turn("next") == "fine"
    with pytest.raises(turnkit.TurnError, match="interrupted \\(Meltdown\\)"):
        await session.result(bad)


async def test_an_event_sink_that_raises_breaks_nothing(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenSink(RecordingSink):
        def emit(self, event: turnkit.TurnEvent) -> None:
            super().emit(event)
            raise RuntimeError("sink down")

    async with turnkit.Runtime(echo(), store=make_store(), sink=BrokenSink()) as rt:
        with caplog.at_level(logging.ERROR):
            assert await rt.session("a", "s1").turn("hi") == "echo: hi"
    assert "sink down" in caplog.text


async def test_a_replaying_subscription_to_an_unknown_turn_is_reported(
    open_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await open_runtime(echo())
    session = rt.session("a", "s1")
    with caplog.at_level(logging.WARNING):
        session.subscribe(lambda e: None, turn_id="nope", replay=True)
        await eventually(lambda: "has no turn nope" in caplog.text, what="the warning")
    assert "has no turn nope" in caplog.text


async def test_starting_the_same_turn_twice_delivers_it_once(open_runtime: Any) -> None:
    model = ScriptedModel(["once"])
    rt = await open_runtime(turnkit.Agent(name="a", model=model))
    session = rt.session("a", "s1")
    first = session.start("hi", turn_id="t1")
    second = session.start("hi", turn_id="t1")
    assert first == second == "t1"
    assert (await session.result("t1")).text == "once"
    assert len(model.calls) == 1


async def test_a_tool_that_mutates_its_input_cannot_change_the_transcript(
    open_runtime: Any,
) -> None:
    def grab(data: dict[str, Any], ctx: Any) -> int:
        return int(data.pop("n")) + len(data.setdefault("extra", []))

    spec = turnkit.ToolSpec(name="grab", description="Pops its input.", input_schema={})
    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("grab", {"n": 1})]), "ok"])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[turnkit.Tool(spec, grab)]))
    session = rt.session("a", "s1")
    await session.turn("go")
    asked = (await session.messages())[1]
    assert isinstance(asked, turnkit.AssistantMessage)
    assert asked.tool_calls[0].input == {"n": 1}
    assert isinstance(model.calls[1].messages[1], turnkit.AssistantMessage)
    assert model.calls[1].messages[1].tool_calls[0].input == {"n": 1}
    assert isinstance((await session.messages())[2], ToolMessage)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ({"text": "not a reply"}, "must be a ModelReply"),
        (turnkit.ModelReply(text=None), "reply text must be a str"),  # type: ignore[arg-type]
        (
            turnkit.ModelReply(tool_calls=(turnkit.ToolCall(id="c", name="x", input='{"a":1}'),)),  # type: ignore[arg-type]
            "needs a str name and a dict input",
        ),
        (
            turnkit.ModelReply(
                tool_calls=(turnkit.ToolCall(id="c", name="x", input={"o": object()}),)
            ),
            "input is not JSON",
        ),
        (
            turnkit.ModelReply(
                tool_calls=(turnkit.ToolCall(id="c", name="x", provider_state="sig"),)  # type: ignore[arg-type]
            ),
            "cannot be stored",
        ),
    ],
)
async def test_malformed_replies_fail_the_step_and_never_reach_the_store(
    open_runtime: Any, reply: Any, error: str
) -> None:
    class Broken:
        async def stream(self, messages: Any, tools: Any, *, system: str | None) -> Any:
            yield turnkit.ModelDone(reply=reply)

    rt = await open_runtime(turnkit.Agent(name="a", model=Broken()))
    session = rt.session("a", "s1")
    result = await session.result(session.start("hi"))
    assert result.status == "failed" and error in (result.error or "")
    assert [m.role for m in await session.messages()] == ["user"]  # still readable


def test_values_that_cannot_be_stored_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="raw must be a str"):
        turnkit.StopReason(kind="end_turn", raw=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Proactive\.by must be a non-empty str"):
        turnkit.Proactive(by=123)  # type: ignore[arg-type]


async def test_text_no_store_can_keep_is_kept_as_u_fffd(open_runtime: Any) -> None:
    """A tool returning an undecodable file name (a lone surrogate) and a model
    replying with NUL: both are kept with U+FFFD in their place, on every store,
    and the turn completes (see _values/text.py)."""
    runs: list[int] = []

    @tool
    def listdir() -> str:
        """Returns an undecodable file name."""
        runs.append(1)
        return b"caf\xe9".decode("utf-8", "surrogateescape")

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("listdir")]), "han\x00dled"])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[listdir]))
    session = rt.session("a", "s1")
    assert await session.turn("ls") == "han\ufffddled"
    msg = (await session.messages())[2]
    assert isinstance(msg, ToolMessage) and not msg.is_error and runs == [1]
    assert msg.result == "caf\ufffd"


async def test_replaying_a_redelivered_finished_turn_ends_cleanly(open_runtime: Any) -> None:
    rt = await open_runtime(echo())
    session = rt.session("a", "s1")
    tid = session.start("hi")
    await session.result(tid)
    session.start("hi", turn_id=tid)
    assert await collect(session, tid, replay=True) == [
        "turn.started",
        "message.completed",
        "turn.completed",
    ]


async def test_sink_subscribers_see_an_ending_after_a_base_exception(open_runtime: Any) -> None:
    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("melt")])])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[melt]))
    session = rt.session("a", "s1")
    seen: list[turnkit.TurnEvent] = []
    tid = session.start("melt")
    session.subscribe(seen.append, turn_id=tid)
    with pytest.raises(turnkit.TurnError):
        await session.result(tid)
    assert seen[-1].type == "turn.failed"
    assert "stays open" in seen[-1].error  # type: ignore[union-attr]


async def test_open_calls_of_a_turn_left_running_run_again_when_it_is_finished(
    tmp_path: Path,
) -> None:
    db = tmp_path / "t.db"
    asked = turnkit.AssistantMessage(
        text="", turn_id="t1", tool_calls=(turnkit.ToolCall(id="c1", name="charge"),)
    )
    await plant_open_turn(db, text="pay", after=[asked])
    model = ScriptedModel(respond=lambda m: f"echo: {getattr(m[-1], 'text', 'a tool result')}")
    agent = turnkit.Agent(name="a", model=model)
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as rt:
        session = rt.session("a", "s1")
        await session.turn("next")
        # The next turn finishes t1 first: its open call is run again (an async
        # tool is at least once), here an unknown tool's error, and t1 completes.
        closing = (await session.messages())[2]
        assert isinstance(closing, ToolMessage) and closing.turn_id == "t1"
        assert closing.is_error
        old = await session.result("t1")
        assert old.status == "completed", old.error


async def test_a_subscriber_mutating_events_cannot_change_the_transcript(
    open_runtime: Any,
) -> None:
    @tool
    def weather(city: str) -> dict[str, str]:
        """Weather."""
        return {"city": city, "secret": "s3"}

    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("weather", {"city": "Oslo"})]), "sunny"]
    )
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[weather]))
    session = rt.session("a", "s1")

    def redact(event: turnkit.TurnEvent) -> None:
        if isinstance(event, turnkit.ActionRequestedEvent):
            event.call.input["city"] = "REDACTED"
        if isinstance(event, turnkit.ActionCompletedEvent):
            event.result.pop("secret")

    session.subscribe(redact)
    await session.turn("weather?")
    seen = model.calls[1].messages
    assert isinstance(seen[1], turnkit.AssistantMessage) and seen[1].tool_calls[0].input == {
        "city": "Oslo"
    }
    assert isinstance(seen[2], ToolMessage) and seen[2].result == {"city": "Oslo", "secret": "s3"}


async def test_max_steps_stops_a_runaway_turn(open_runtime: Any) -> None:
    @tool
    def again() -> str:
        """Keeps the model going."""
        return "more"

    model = ScriptedModel(respond=lambda m: ScriptedReply(tool_calls=[tool_call("again")]))
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[again], max_steps=3))
    session = rt.session("a", "s1")
    result = await session.result(session.start("loop"))
    assert result.status == "failed" and "limit of 3 model steps" in (result.error or "")
    assert len(model.calls) == 3
    with pytest.raises(turnkit.ConfigurationError, match="max_steps must be a positive int"):
        turnkit.Agent(name="a", model=model, max_steps=0)


async def test_recover_keeps_going_when_one_turn_fails_again(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    await plant_open_turn(db, session_id="s1", turn_id="t-s1", agent="gone", text="hi")
    await plant_open_turn(db, session_id="s2", turn_id="t-s2", agent="a", text="hi")
    async with turnkit.Runtime(echo(), store=SqliteStore(db)) as rt:
        results = await rt.recover()
    assert [(r.turn_id, r.text) for r in results] == [("t-s2", "echo: hi")]


async def test_a_turn_refused_before_its_opening_says_nothing_was_stored(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    async with turnkit.Runtime(echo(), store=store) as rt:
        await rt.session("a", "s1").turn("mine")
    other = turnkit.Agent(name="b", model=ScriptedModel(["never"]))
    async with turnkit.Runtime(other, store=make_store()) as rt:
        session = rt.session("b", "s1")
        seen: list[turnkit.TurnEvent] = []
        tid = session.start("hi")
        session.subscribe(seen.append, turn_id=tid)
        with caplog.at_level(logging.CRITICAL), pytest.raises(turnkit.ConfigurationError):
            await session.result(tid)
        assert seen[-1].type == "turn.failed"
        error = seen[-1].error  # type: ignore[union-attr]
        assert "nothing was stored" in error and "stays open" not in error
        assert "belongs to agent 'a'" in error
        assert await rt.store.session("s1").turn(tid) is None


async def test_a_queued_turn_in_a_session_of_another_agent_fails_rather_than_staying_queued(
    make_store: Any,
) -> None:
    """A node that lost a race for a new session to another agent's node (or that
    remembered as its own a session since pruned and taken by another agent) has
    stored its turn queued. Its delivery ends it failed, saying why; before, every
    delivery refused it and left it queued, to be claimed and refused again."""
    store = make_store()
    async with turnkit.Runtime(echo(), store=store) as rt:
        await rt.session("a", "s1").turn("mine")
        lost = TurnRecord(
            session_id="s1",
            turn_id="t-b",
            agent="b",
            status="queued",
            opening=UserMessage(text="hi", turn_id="t-b"),
            created_at=time.time(),
        )
        await store.session("s1").commit([turn_rules.new_turn(lost)])
    other = turnkit.Agent(name="b", model=ScriptedModel(["never"]))
    async with turnkit.Runtime(other, store=make_store()) as rt:
        results = await asyncio.wait_for(rt.recover(), HANG_GUARD)
        stored = await rt.store.session("s1").turn("t-b")
        left = await rt.store.unfinished_turns()
    assert [(r.turn_id, r.status) for r in results] == [("t-b", "failed")]
    assert stored is not None and stored.status == "failed"
    assert "session s1 belongs to agent 'a', not 'b'" in (stored.error or "")
    assert left == []


async def test_a_client_that_remembers_a_pruned_session_as_its_own_gets_a_failed_turn(
    tmp_path: Path,
) -> None:
    """Three processes on one SQLite file (each its own store): a node of agent ``a``
    has found session s1 its own and no longer reads whose it is; retention prunes the
    idle session, agent ``b`` takes the id, and the node submits again. Its turn is
    stored in ``b``'s session, and its delivery by ``a``'s worker ends it failed,
    saying whose session it is; ``b``'s history is untouched."""
    db = tmp_path / "t.db"
    async with turnkit.RuntimeClient(echo(), store=SqliteStore(db)) as node:
        for n in range(2):  # the second submission finds the session a's: remembered
            turn_id = await node.session("a", "s1").submit(f"mine {n}")
            async with turnkit.Runtime(echo(), store=SqliteStore(db)) as worker:
                await worker.recover()
            assert (await node.session("a", "s1").result(turn_id)).status == "completed"
        keep = turnkit.Retention(sessions_idle_for=0.001)
        async with turnkit.Runtime(echo(), store=SqliteStore(db), retention=keep) as rt:
            report = await rt.prune(now=time.time() + 60)
        assert report.sessions == 1
        theirs = turnkit.Agent(name="b", model=ScriptedModel(["b's answer"]))
        async with turnkit.Runtime(theirs, store=SqliteStore(db)) as rt:
            assert await rt.session("b", "s1").turn("b's question") == "b's answer"
        stale = await node.session("a", "s1").submit("mine again")
        async with turnkit.Runtime(echo(), store=SqliteStore(db)) as worker:
            results = await asyncio.wait_for(worker.recover(), HANG_GUARD)
        ended = await node.session("a", "s1").turn_record(stale)
        texts = [m.text for m in await node.session("a", "s1").messages()]
    assert [(r.turn_id, r.status) for r in results] == [(stale, "failed")]
    assert ended is not None and ended.status == "failed"
    assert "session s1 belongs to agent 'b', not 'a'" in (ended.error or "")
    assert texts == ["b's question", "b's answer"]


def test_copy_input_shares_nothing_that_can_be_mutated() -> None:
    from collections import OrderedDict

    from turnkit._engine.tool_call import copy_input

    inner = {"b": [1, {"c": 2}]}
    value = {"a": inner, "n": 1, "s": "x"}
    copy = copy_input(value)
    assert copy == value and copy is not value
    copy["a"]["b"][1]["c"] = 3
    copy["a"]["b"].append(4)
    copy["n"] = 2
    assert value == {"a": {"b": [1, {"c": 2}]}, "n": 1, "s": "x"}
    ordered = copy_input(OrderedDict(k=[1]))
    assert type(ordered) is dict and ordered == {"k": [1]}
