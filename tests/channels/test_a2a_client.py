"""``a2a_agent(url)``: one turnkit agent calling another over A2A, through a real
server on a loopback port. The remote task's id is kept with the call before it
waits; a remote ``input-required`` parks the caller's turn with the question.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from a2a_support import Gate, clerk
from server_support import serving

import turnkit
from turnkit import ToolContext, ToolMessage, UserMessage, tool
from turnkit.a2a import a2a_agent, a2a_server
from turnkit.stores import MemoryStore, SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def lead(url: str, **options: object) -> turnkit.Agent:
    def respond(messages: Sequence[turnkit.Message]) -> ScriptedReply:
        last = messages[-1]
        if isinstance(last, UserMessage):
            call = tool_call("clerk", {"message": last.text}, id="ask")
            return ScriptedReply(text="Asking the clerk.", tool_calls=[call])
        assert isinstance(last, ToolMessage)
        if last.is_error:
            return ScriptedReply(text=f"The clerk failed: {last.result}")
        return ScriptedReply(text=f"The clerk said: {last.result['text']}")

    remote = a2a_agent(
        f"{url}/agents/clerk/a2a",
        name="clerk",
        description="Refunds and echoes.",
        headers={"X-User": "lead-agent"},
        **options,  # type: ignore[arg-type]
    )
    return turnkit.Agent(name="lead", model=ScriptedModel(respond=respond), tools=[remote])


@pytest.fixture
async def remote():
    gate = Gate()
    runtime = turnkit.Runtime([clerk(gate)], store=MemoryStore())
    async with runtime, serving(runtime, frontends=[a2a_server()]) as served:
        yield served
        gate.released.set()


async def test_an_agent_asks_a_remote_agent_and_keeps_its_task_with_the_call(remote) -> None:
    store = MemoryStore()
    async with turnkit.Runtime([lead(remote.url)], store=store) as runtime:
        session = runtime.session("lead", "s1")
        result = await session.result(await session.submit("hello", turn_id="t1"))
        assert result.text == "The clerk said: You said hello."
        steps = (await store.session("s1").load(turn_id="t1")).steps
    [(note_id, held)] = [(k, v) for k, v in steps.items() if k.startswith("note:")]
    assert ":a2a-task:" in note_id and note_id.endswith(":ask")
    # The task kept is the remote's turn: its id names its session there.
    context, _, _ = held["task_id"].rpartition("~")
    assert context == held["context_id"]
    record = await remote.runtime.store.session(context).turn(held["task_id"])
    assert record is not None and record.status == "completed"
    [tool_step] = [v for k, v in steps.items() if k.startswith("tool:")]
    assert tool_step["result"]["task_id"] == held["task_id"]


async def test_a_remote_question_parks_the_turn_and_the_answer_goes_to_the_remote_task(
    remote,
) -> None:
    async with turnkit.Runtime([lead(remote.url)], store=MemoryStore()) as runtime:
        session = runtime.session("lead", "s2")
        parked = await session.result(await session.submit("refund A-1", turn_id="t2"))
        assert parked.status == "suspended"
        [question] = parked.requests
        assert question.prompt == "Refund A-1?" and question.schema == {"type": "boolean"}
        await session.resume("t2", question.id, True)
        done = await session.result("t2")
        assert done.text == "The clerk said: Done: A-1 refunded."
    # One remote task, answered once, by the caller's principal.
    sessions = await remote.runtime.store.session_page(limit=10)
    assert len(sessions) == 1
    snap = await remote.runtime.store.session(sessions[0].session_id).load()
    assert [m.text for m in snap.messages if isinstance(m, UserMessage)] == ["refund A-1"]


async def test_a_remote_task_that_fails_or_cannot_be_reached_reads_as_a_tool_error() -> None:
    async with turnkit.Runtime([lead("http://127.0.0.1:9")], store=MemoryStore()) as runtime:
        session = runtime.session("lead", "s3")
        result = await session.result(await session.submit("hello"))
        assert result.text is not None
        assert result.text.startswith("The clerk failed:") and "agent card" in result.text


async def test_remember_keeps_a_value_with_the_call_across_a_park() -> None:
    seen: list[object] = []

    @tool
    async def probe(ctx: ToolContext) -> str:
        """Remembers, asks, then reads back."""
        seen.append(ctx.recall("handle"))
        await ctx.remember("handle", {"id": 7})
        await ctx.remember("handle", {"id": 7})  # the same again: nothing to do
        answer = await ctx.request_input("go", "Go on?")
        return f"{ctx.recall('handle')} {answer}"

    def respond(messages: Sequence[turnkit.Message]) -> ScriptedReply:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("probe", id="p")])
        return ScriptedReply(text=f"probe: {messages[-1].result}")  # type: ignore[union-attr]

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[probe])
    async with turnkit.Runtime([agent], store=MemoryStore()) as runtime:
        session = runtime.session("a", "s")
        parked = await session.result(await session.submit("go", turn_id="t"))
        assert parked.status == "suspended"
        await session.resume("t", "go", "yes")
        assert (await session.result("t")).text == "probe: {'id': 7} yes"
        steps = (await runtime.store.session("s").load(turn_id="t")).steps
        assert steps["note:1:handle:p"] == {"id": 7}
        # A fork keeps a call's note exactly when it keeps the call.
        whole = await session.fork(new_session="whole")
        cut = await session.fork("tool:1:p", new_session="cut")
        assert "note:1:handle:p" in (await runtime.store.session("whole").load(turn_id="t")).steps
        assert "note:1:handle:p" not in (await runtime.store.session("cut").load(turn_id="t")).steps
        assert whole.session_id == "whole" and cut.session_id == "cut"
    assert seen == [None, {"id": 7}]


async def test_remembering_another_value_under_a_key_fails_the_turn() -> None:
    @tool
    async def fickle(ctx: ToolContext) -> str:
        """Changes its mind."""
        await ctx.remember("k", 1)
        await ctx.remember("k", 2)
        return "never"

    agent = turnkit.Agent(
        name="a",
        model=ScriptedModel([ScriptedReply(tool_calls=[tool_call("fickle")]), "unused"]),
        tools=[fickle],
    )
    async with turnkit.Runtime([agent], store=MemoryStore()) as runtime:
        session = runtime.session("a", "s")
        result = await session.result(await session.submit("x"))
    assert result.status == "failed" and "already remembered 1" in (result.error or "")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_calls_running_side_by_side_each_keep_their_own_notes(
    kind: str, tmp_path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        store: turnkit.Store = SqliteStore(str(tmp_path / "notes.db"))
    else:
        from turnkit.stores import PostgresStore

        dsn = request.getfixturevalue("pg_dsn")
        store = PostgresStore(dsn, schema=request.getfixturevalue("pg_schema"))

    @tool
    async def fetch(item: str, ctx: ToolContext) -> str:
        """Start a job and keep its handle."""
        for step in range(5):
            await ctx.remember(f"job{step}", f"{item}-{step}")
            await asyncio.sleep(0)  # not a wait: a tool that yields between its steps
        return ",".join(ctx.recall(f"job{step}") for step in range(5))

    def respond(messages: Sequence[turnkit.Message]) -> ScriptedReply:
        if isinstance(messages[-1], UserMessage):
            calls = [tool_call("fetch", {"item": i}, id=f"c_{i}") for i in ("a", "b", "c")]
            return ScriptedReply(tool_calls=calls)
        return ScriptedReply(text=" ".join(str(m.result) for m in messages[-3:]))  # type: ignore[union-attr]

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[fetch])
    async with turnkit.Runtime([agent], store=store) as runtime:
        session = runtime.session("a", "s")
        result = await session.result(await session.submit("go", turn_id="t"))
        assert result.text == "a-0,a-1,a-2,a-3,a-4 b-0,b-1,b-2,b-3,b-4 c-0,c-1,c-2,c-3,c-4"
        steps = (await runtime.store.session("s").load(turn_id="t")).steps
    notes = sorted(k for k in steps if k.startswith("note:"))
    assert len(notes) == 15 and notes[0] == "note:1:job0:c_a"
