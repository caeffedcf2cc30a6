"""The turn loop on every store: checkpoints, replay, tool results and failures."""

from __future__ import annotations

import gc
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import turnkit
from turnkit import (
    AssistantMessage,
    FatalToolError,
    ModelReply,
    StopReason,
    ToolContext,
    ToolMessage,
    UserMessage,
    tool,
)
from turnkit._engine.loop import TurnRunner
from turnkit.stores import SqliteStore
from turnkit.testing import RecordingSink, ScriptedModel, ScriptedReply, tool_call


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def fetch(url: str, ctx: ToolContext) -> dict[str, str]:
    """Pretend to fetch a URL."""
    return {"url": url, "key": ctx.idempotency_key}


def agent(
    model: turnkit.Model, *tools: turnkit.Tool, instructions: str = "Be brief."
) -> turnkit.Agent:
    return turnkit.Agent(
        name="a", model=model, instructions=instructions, tools=tools or (add, fetch)
    )


def roles(messages: list[turnkit.Message]) -> list[str]:
    return [m.role for m in messages]


async def test_a_turn_runs_model_tools_model_and_checkpoints_each_step(
    open_runtime: Any, sink: RecordingSink
) -> None:
    model = ScriptedModel(
        [
            ScriptedReply(text="Adding.", tool_calls=[tool_call("add", {"a": 2, "b": 3})]),
            "The sum is 5.",
        ]
    )
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    assert await session.status() == "new"
    assert await session.turn("what is 2+3?") == "The sum is 5."
    msgs = await session.messages()
    assert roles(msgs) == ["user", "assistant", "tool", "assistant"]
    assert isinstance(msgs[2], ToolMessage) and msgs[2].result == 5 and not msgs[2].is_error
    assert await session.status() == "idle"
    # The model saw the system prompt and the tool specs, and the transcript so far.
    assert model.calls[0].system == "Be brief."
    assert [t.name for t in model.calls[0].tools] == ["add", "fetch"]
    assert roles(list(model.calls[1].messages)) == ["user", "assistant", "tool"]
    assert sink.types() == [
        "turn.started",
        *["message.delta"] * 1,
        "message.completed",
        "action.requested",
        "action.completed",
        *["message.delta"] * 4,
        "message.completed",
        "turn.completed",
    ]


async def test_structural_events_are_logged_with_consecutive_sequence_numbers(
    open_runtime: Any, sink: RecordingSink
) -> None:
    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("add", {"a": 1, "b": 1})]), "2"])
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    tid = session.start("1+1")
    await session.result(tid)
    logged = await session.events(turn_id=tid)
    assert [e.type for e in logged] == [
        "turn.started",
        "message.completed",
        "action.requested",
        "action.completed",
        "message.completed",
        "turn.completed",
    ]
    assert [e.seq for e in logged] == [1, 2, 3, 4, 5, 6]
    live = [e for e in sink.events if e.seq is not None]
    assert [e.to_dict() for e in live] == [e.to_dict() for e in logged]
    assert all(e.seq is None for e in sink.events if e.type == "message.delta")


async def test_redelivering_a_completed_turn_runs_nothing_and_emits_no_deltas(
    open_runtime: Any, sink: RecordingSink
) -> None:
    model = ScriptedModel(["hello there"])
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    tid = session.start("hi")
    assert (await session.result(tid)).text == "hello there"
    before = len(sink.events)
    again = session.start("hi", turn_id=tid)
    assert again == tid
    result = await session.result(tid)
    assert result.status == "completed" and result.text == "hello there"
    assert len(model.calls) == 1
    # Nothing runs again: only the logged terminal event is announced, so observers end.
    logged_end = (await session.events(turn_id=tid))[-1]
    assert sink.events[before:] == [logged_end]
    assert roles(await session.messages()) == ["user", "assistant"]


async def test_replay_after_a_failed_model_step_skips_finished_steps(
    open_runtime: Any, sink: RecordingSink
) -> None:
    ran: list[int] = []

    @tool
    def record(n: int) -> str:
        """Record n."""
        ran.append(n)
        return "ok"

    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=[tool_call("record", {"n": 1})]),
            RuntimeError("provider down"),
            "done",
        ]
    )
    rt = await open_runtime(agent(model, record))
    session = rt.session("a", "s1")
    tid = session.start("go")
    failed = await session.result(tid)
    assert failed.status == "failed"
    assert failed.error == "model error: RuntimeError: provider down"
    assert roles(await session.messages()) == ["user", "assistant", "tool"]
    # Redelivery asks the model again from the first unfinished step only.
    session.start("go", turn_id=tid)
    assert (await session.result(tid)).text == "done"
    assert ran == [1]
    assert roles(await session.messages()) == ["user", "assistant", "tool", "assistant"]
    assert [m.role for m in model.calls[2].messages] == ["user", "assistant", "tool"]
    # The retried delivery logs a fresh turn.started; replay observers fold from there.
    types = [e.type for e in await session.events(turn_id=tid)]
    assert types.count("turn.started") == 2 and types[-1] == "turn.completed"
    # Replay tells the turn as one story: the failed attempt's markers are folded away.
    replayed = [e.type async for e in session.observe(tid, replay=True)]
    assert replayed == [
        "turn.started",
        "message.completed",
        "action.requested",
        "action.completed",
        "message.completed",
        "turn.completed",
    ]


async def test_tool_errors_become_results_the_model_reads(open_runtime: Any) -> None:
    class QuotaError(Exception):
        pass

    @tool
    def quota() -> None:
        """Always over quota."""
        raise QuotaError("quota exceeded")

    @tool
    async def plain() -> None:
        """Raises a bare Exception."""
        raise Exception("plain failure")

    @tool
    def long_error() -> None:
        """Raises a long error."""
        raise ValueError("x" * 5000)

    model = ScriptedModel(
        [
            ScriptedReply(
                tool_calls=[tool_call("quota"), tool_call("plain"), tool_call("long_error")]
            ),
            "handled",
        ]
    )
    rt = await open_runtime(agent(model, quota, plain, long_error))
    session = rt.session("a", "s1")
    assert await session.turn("go") == "handled"
    tools = [m for m in await session.messages() if isinstance(m, ToolMessage)]
    assert tools[0].result == {"error": "QuotaError: quota exceeded"} and tools[0].is_error
    assert tools[1].result == {"error": "plain failure"}
    assert len(tools[2].result["error"]) == 2000
    assert tools[2].result["error"].startswith("ValueError: xxx")
    assert "Traceback" not in json.dumps([t.result for t in tools])
    # The model read the errors on its next step.
    seen = [m for m in model.calls[1].messages if isinstance(m, ToolMessage)]
    assert [m.is_error for m in seen] == [True, True, True]
    completed = [e for e in await session.events() if e.type == "action.completed"]
    assert next(e.error for e in completed) == "QuotaError: quota exceeded"


async def test_invalid_input_is_an_error_result_the_model_can_correct(open_runtime: Any) -> None:
    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=[tool_call("add", {"a": "two", "c": 1})]),
            ScriptedReply(tool_calls=[tool_call("add", {"a": 2, "b": 2})]),
            "4",
        ]
    )
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    assert await session.turn("2+2") == "4"
    first, second = [m for m in await session.messages() if isinstance(m, ToolMessage)]
    assert first.is_error
    error = first.result["error"]
    assert error.startswith("invalid input: ")
    assert "a: Input should be a valid integer" in error
    assert "b: Field required" in error and "c: Extra inputs are not permitted" in error
    assert second.result == 4


async def test_unknown_tool_never_runs_and_reads_as_an_error(open_runtime: Any) -> None:
    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("rm_rf", {"path": "/"})]), "sorry"])
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    assert await session.turn("delete everything") == "sorry"
    msg = (await session.messages())[2]
    assert isinstance(msg, ToolMessage)
    assert msg.result == {"error": "unknown tool: rm_rf"} and msg.is_error


async def test_fatal_tool_error_fails_the_turn(open_runtime: Any, sink: RecordingSink) -> None:
    @tool
    def broken() -> None:
        """A deployment mistake."""
        raise FatalToolError("no database configured")

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("broken")]), "unreachable"])
    rt = await open_runtime(agent(model, broken))
    session = rt.session("a", "s1")
    with pytest.raises(turnkit.TurnFailedError) as caught:
        await session.turn("go")
    assert "no database configured" in caught.value.error
    assert sink.types()[-1] == "turn.failed"
    assert roles(await session.messages()) == ["user", "assistant"]
    assert await session.status() == "idle"
    assert len(model.calls) == 1


async def test_a_def_that_returns_an_awaitable_fails_the_turn_and_records_nothing(
    open_runtime: Any,
) -> None:
    async def work() -> str:
        return "late"

    @tool
    def sneaky() -> Any:
        """Returns a coroutine from a plain def."""
        return work()

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("sneaky")]), "unreachable"])
    rt = await open_runtime(agent(model, sneaky))
    session = rt.session("a", "s1")
    tid = session.start("go")
    result = await session.result(tid)
    assert result.status == "failed"
    assert "'sneaky'" in (result.error or "") and "async def" in (result.error or "")
    assert roles(await session.messages()) == ["user", "assistant"]


async def test_abnormal_stop_with_empty_reply_fails_before_commit(open_runtime: Any) -> None:
    model = ScriptedModel([ScriptedReply(stop=StopReason(kind="max_tokens", raw="length"))])
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    result = await session.result(session.start("write a novel"))
    assert result.status == "failed"
    assert (
        result.error == "model error: the model stopped with max_tokens (length) and an empty reply"
    )
    assert roles(await session.messages()) == ["user"]


async def test_abnormal_stop_with_content_still_commits(open_runtime: Any) -> None:
    model = ScriptedModel([ScriptedReply(text="Chapter 1", stop=StopReason(kind="max_tokens"))])
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    assert await session.turn("write a novel") == "Chapter 1"
    last = (await session.messages())[-1]
    assert isinstance(last, AssistantMessage) and last.stop == StopReason(kind="max_tokens")


async def test_model_stream_without_done_fails_the_turn(open_runtime: Any) -> None:
    class Mute:
        async def stream(self, messages: Any, tools: Any, *, system: str | None) -> Any:
            yield turnkit.TextDelta(text="hm")

    rt = await open_runtime(agent(Mute()))
    session = rt.session("a", "s1")
    result = await session.result(session.start("hi"))
    assert result.error == "model error: the stream ended without ModelDone"


async def test_repeated_tool_call_ids_are_refused(open_runtime: Any) -> None:
    reply = ModelReply(tool_calls=(turnkit.ToolCall(id="x", name="add"),) * 2)
    rt = await open_runtime(agent(ScriptedModel([reply])))
    session = rt.session("a", "s1")
    result = await session.result(session.start("hi"))
    assert result.status == "failed" and "repeated" in (result.error or "")


async def test_next_turn_closes_calls_a_failed_turn_left_unanswered(open_runtime: Any) -> None:
    @tool
    def explode() -> None:
        """Fails the turn."""
        raise FatalToolError("boom")

    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=[tool_call("explode"), tool_call("add", {"a": 1, "b": 1})]),
            "fresh start",
        ]
    )
    rt = await open_runtime(agent(model, explode, add))
    session = rt.session("a", "s1")
    first = session.start("one")
    assert (await session.result(first)).status == "failed"
    assert await session.turn("two") == "fresh start"
    msgs = await session.messages()
    assert roles(msgs) == ["user", "assistant", "tool", "tool", "user", "assistant"]
    closing = [m for m in msgs if isinstance(m, ToolMessage)]
    assert [m.call_id for m in closing] == ["call_1", "call_2"]
    assert all(m.is_error and m.turn_id == first for m in closing)
    # The provider saw a valid transcript: every call answered before the next user message.
    assert roles(list(model.calls[1].messages)) == ["user", "assistant", "tool", "tool", "user"]
    # The failed turn cannot be resumed any more: a later turn has started.
    session.start("one", turn_id=first)
    assert (await session.result(first)).status == "failed"
    assert len(await session.messages()) == len(msgs)


@pytest.mark.parametrize("parallel", [1, 4])
async def test_idempotency_key_is_stable_per_call_and_unique_otherwise(
    open_runtime: Any, parallel: int
) -> None:
    keys: list[tuple[str, str]] = []

    @tool
    async def charge(ctx: ToolContext) -> str:
        """Charge a card."""
        keys.append((ctx.call_id, ctx.idempotency_key))
        if len(keys) == 1:
            raise FatalToolError("network dropped after the charge")
        return "charged"

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("charge"), tool_call("charge", id="c2")])
        return "ok"

    model = ScriptedModel(respond=respond)
    rt = await open_runtime(
        turnkit.Agent(name="a", model=model, tools=[charge], max_parallel_tools=parallel)
    )
    s1, s2 = rt.session("a", "s1"), rt.session("a", "s2")
    tid = s1.start("pay")
    assert (await s1.result(tid)).status == "failed"
    s1.start("pay", turn_id=tid)  # redelivery re-runs the unfinished call with the same key
    assert (await s1.result(tid)).status == "completed"
    await s1.turn("pay again")
    await s2.turn("pay")
    failed_call, failed_key = keys[0]
    replays = [key for call, key in keys[1:3] if call == failed_call]
    assert replays == [failed_key]  # the same call, replayed once with its key
    others = [key for _, key in keys if key != failed_key]
    assert len(set(others)) == len(others) == 2 + 2 + 1  # every other call, turn, session
    assert len(keys) == 2 + 2 + 2 + 1


def _invoicing_agent(keys: list[tuple[str, str]]) -> turnkit.Agent:
    """Each turn calls ``bill`` once with the turn's text; the key of every run of it
    is recorded. The first run of each call "loses the network" after it was sent."""

    @tool
    async def bill(what: str, ctx: ToolContext) -> str:
        """Send a bill to the remote service."""
        keys.append((what, ctx.idempotency_key))
        if sum(1 for w, _ in keys if w == what) == 1:
            raise FatalToolError("network dropped after the request was sent")
        return f"{what} sent"

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("bill", {"what": last.text})])
        return "ok"

    return agent(ScriptedModel(respond=respond), bill)


async def test_idempotency_keys_differ_across_resets_and_stay_across_reopening(
    make_store: Any,
) -> None:
    """A reset lets a turn id come back for another call (an invoice in generation 0,
    a refund in generation 1): the remote service must not take the refund for a
    replay of the invoice. A replay of one call keeps its key, even in a new runtime."""
    keys: list[tuple[str, str]] = []
    async with turnkit.Runtime(_invoicing_agent(keys), store=make_store()) as rt:
        session = rt.session("a", "s1")
        assert (await session.result(session.start("invoice", turn_id="t1"))).status == "failed"
    async with turnkit.Runtime(_invoicing_agent(keys), store=make_store()) as rt:
        session = rt.session("a", "s1")  # a new runtime on the same data redelivers
        assert (await session.result(session.start("", turn_id="t1"))).text == "ok"
    async with turnkit.Runtime(_invoicing_agent(keys), store=make_store()) as rt:
        session = rt.session("a", "s1")
        await session.reset()
        assert (await session.result(session.start("refund", turn_id="t1"))).status == "failed"
        assert (await session.result(session.start("", turn_id="t1"))).text == "ok"
    assert [what for what, _ in keys] == ["invoice", "invoice", "refund", "refund"]
    (invoice, invoice_again, refund, refund_again) = (key for _, key in keys)
    assert invoice == invoice_again and refund == refund_again  # replays dedupe
    assert invoice != refund  # the same session, turn id and step id, another generation


async def test_idempotency_keys_differ_between_stores(tmp_path: Path) -> None:
    """Two stores may hold the same session and turn ids; a remote service shared by
    both must still tell their calls apart."""
    keys: list[tuple[str, str]] = []
    for store in (SqliteStore(tmp_path / "a.db"), SqliteStore(tmp_path / "b.db")):
        async with turnkit.Runtime(_invoicing_agent(keys), store=store) as rt:
            await rt.session("a", "s1").result(rt.session("a", "s1").start("x", turn_id="t1"))
    first, second = (key for _, key in keys)
    assert first != second


async def test_model_sees_transcript_of_previous_turns(open_runtime: Any) -> None:
    model = ScriptedModel(["first", "second"])
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    await session.turn("one")
    await session.turn("two")
    assert [getattr(m, "text", None) for m in model.calls[1].messages] == ["one", "first", "two"]


async def test_reasoning_deltas_stream_but_are_not_stored(
    open_runtime: Any, sink: RecordingSink
) -> None:
    model = ScriptedModel([ScriptedReply(reasoning="think hard", text="answer")])
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    await session.turn("q")
    reasoning = [e for e in sink.events if e.type == "reasoning.delta"]
    assert "".join(e.text for e in reasoning) == "think hard"
    assert "think hard" not in json.dumps([m.to_dict() for m in await session.messages()])


# -- the transaction a local tool joins -------------------------------------------------


def orders_tool(fail_after_write: bool = False) -> turnkit.Tool:
    @tool
    def create_order(item: str, ctx: ToolContext) -> dict[str, Any]:
        """Create an order row."""
        ctx.store.execute("CREATE TABLE IF NOT EXISTS orders (item TEXT NOT NULL)")
        ctx.store.execute("INSERT INTO orders (item) VALUES (?)", (item,))
        if fail_after_write:
            raise ValueError("card declined")
        return {"item": item}

    return create_order


async def test_sqlite_local_tool_writes_commit_with_the_step(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("create_order", {"item": "pen"})]), "ordered"]
    )
    async with turnkit.Runtime(agent(model, orders_tool()), store=SqliteStore(db)) as rt:
        assert await rt.session("a", "s1").turn("buy a pen") == "ordered"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT item FROM orders").fetchall() == [("pen",)]


async def test_sqlite_local_tool_error_rolls_back_its_writes(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("create_order", {"item": "pen"})]), "declined"]
    )
    async with turnkit.Runtime(agent(model, orders_tool(True)), store=SqliteStore(db)) as rt:
        session = rt.session("a", "s1")
        assert await session.turn("buy a pen") == "declined"
        msg = (await session.messages())[2]
    assert isinstance(msg, ToolMessage) and msg.result == {"error": "ValueError: card declined"}
    with sqlite3.connect(db) as conn:
        # The CREATE TABLE rolled back too: SQLite DDL is transactional.
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'orders'").fetchall() == []


async def test_sqlite_handle_is_the_connection_inside_the_step_transaction(
    tmp_path: Path,
) -> None:
    seen: list[Any] = []

    @tool
    def peek(ctx: ToolContext) -> bool:
        """Look at the handle."""
        conn = ctx.store.unwrap()
        seen.append((type(conn), conn.in_transaction))
        return True

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("peek")]), "ok"])
    async with turnkit.Runtime(agent(model, peek), store=SqliteStore(tmp_path / "s.db")) as rt:
        await rt.session("a", "s1").turn("go")
    assert seen == [(sqlite3.Connection, True)]


async def test_memory_store_has_no_handle_and_execute_fails_the_turn() -> None:
    from turnkit.stores import MemoryStore

    seen: list[object] = []

    @tool
    def peek(ctx: ToolContext) -> bool:
        """Look at the handle."""
        seen.append(ctx.store.unwrap())
        return True

    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("peek"), tool_call("create_order", {"item": "x"})])]
    )
    async with turnkit.Runtime(agent(model, peek, orders_tool()), store=MemoryStore()) as rt:
        session = rt.session("a", "s1")
        result = await session.result(session.start("go"))
    assert seen == [None]
    assert result.status == "failed"
    assert "in-memory store has no transactional handle" in (result.error or "")


async def test_remote_tool_store_handle_refuses_with_a_clear_error(open_runtime: Any) -> None:
    @tool
    async def remote_write(ctx: ToolContext) -> None:
        """Tries to write from an async tool."""
        assert ctx.store.unwrap() is None
        ctx.store.execute("SELECT 1")

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("remote_write")])])
    rt = await open_runtime(agent(model, remote_write))
    session = rt.session("a", "s1")
    result = await session.result(session.start("go"))
    assert result.status == "failed"
    assert "async (remote)" in (result.error or "") and "plain `def`" in (result.error or "")


async def test_provider_state_is_stored_on_the_assistant_message_and_sent_back(
    open_runtime: Any,
) -> None:
    state = {"thinking": [{"type": "thinking", "thinking": "hmm", "signature": "sig"}]}
    first = ModelReply(
        text="",
        tool_calls=(turnkit.ToolCall(id="c1", name="add", input={"a": 1, "b": 1}),),
        stop=StopReason(kind="tool_use"),
        provider_state=state,
    )
    model = ScriptedModel([first, "2"])
    rt = await open_runtime(agent(model))
    session = rt.session("a", "s1")
    assert await session.turn("1+1?") == "2"
    stored = (await session.messages())[1]
    assert isinstance(stored, AssistantMessage) and stored.provider_state == state
    sent = model.calls[1].messages[1]
    assert isinstance(sent, AssistantMessage) and sent.provider_state == state


async def test_a_finished_turn_is_freed_at_once_not_left_to_the_cyclic_collector(
    open_runtime: Any,
) -> None:
    """A delivery's runner, and all it read, go as soon as the turn ends: held in a
    reference cycle they would wait for the cyclic garbage collector, whose runs cost a
    busy worker ~11% of its CPU (one runner a turn). Every kind of step runs: a ``def``
    tool, an ``async`` one, a history policy's windows, a sink that may raise."""
    turns = 3
    script: list[Any] = []
    for i in range(turns + 1):
        calls = [tool_call("add", {"a": i, "b": 1}), tool_call("fetch", {"url": f"u{i}"})]
        script += [ScriptedReply(tool_calls=calls), f"done {i}"]
    model = ScriptedModel(script, record_calls=False)
    runner_agent = turnkit.Agent(
        name="a", model=model, tools=(add, fetch), history=turnkit.LastTurns(2)
    )
    rt = await open_runtime(runner_agent)
    session = rt.session("a", "s1")
    assert await session.turn("warm up") == "done 0"  # first-use caches
    gc.collect()
    gc.disable()
    try:
        for i in range(1, turns + 1):
            assert await session.turn(f"turn {i}") == f"done {i}"
        left = sum(1 for o in gc.get_objects() if isinstance(o, TurnRunner))
    finally:
        gc.enable()
    assert left == 0, f"{left} finished turns' runners wait for the cyclic collector"
