"""Cancellation at checkpoint boundaries, replace, and session reset — on every store."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from suite_paths import CHILDREN

import turnkit
from turnkit import (
    ModelDelta,
    ModelDone,
    ModelReply,
    StopReason,
    TextDelta,
    ToolContext,
    ToolMessage,
    ToolSpec,
    UserMessage,
    tool,
)
from turnkit.stores import RequestReset
from turnkit.testing import RecordingSink, ScriptedModel, ScriptedReply, tool_call

CHILD = CHILDREN / "cancel_child.py"


class Gates:
    """Remote tools that block until the test lets them through."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.ran: list[str] = []

    def tool(self) -> turnkit.Tool:
        @tool
        async def wait(label: str) -> str:
            """Waits at the gate."""
            self.ran.append(label)
            self.reached.set()
            await self.release.wait()
            return f"through {label}"

        return wait


def gated_agent(gates: Gates, *, calls: int = 1, parallel: int = 4) -> turnkit.Agent:
    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(
                tool_calls=[tool_call("wait", {"label": f"{last.text}-{i}"}) for i in range(calls)]
            )
        return f"answered {last.turn_id[:4]}"

    model = ScriptedModel(respond=respond)
    return turnkit.Agent(name="a", model=model, tools=[gates.tool()], max_parallel_tools=parallel)


def roles(messages: Sequence[turnkit.Message]) -> list[str]:
    return [m.role for m in messages]


# -- cancellation at each boundary -------------------------------------------------


async def test_cancelled_before_the_opening_commits_leaves_no_trace(
    open_runtime: Any, sink: RecordingSink
) -> None:
    rt = await open_runtime(gated_agent(Gates()))
    session = rt.session("a", "s1")
    tid = session.start("x")
    assert await session.cancel() == [tid]
    result = await session.result(tid)
    assert (result.status, result.reason) == ("cancelled", "requested")
    assert await session.messages() == [] and await session.status() == "new"
    assert await session._store.turn(tid) is None
    assert await session.events() == []
    assert sink.types() == ["turn.cancelled"]  # observers are told, live only


async def test_cancelled_while_a_tool_runs_stops_before_the_next_model_call(
    open_runtime: Any, sink: RecordingSink
) -> None:
    gates = Gates()
    agent = gated_agent(gates)
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    tid = session.start("x")
    await gates.reached.wait()
    assert await session.cancel() == [tid]
    gates.release.set()
    result = await session.result(tid)
    assert (result.status, result.reason) == ("cancelled", "requested")
    messages = await session.messages()
    # The tool that was running finished and its result committed; the model was not
    # asked again.
    assert roles(messages) == ["user", "assistant", "tool"]
    assert isinstance(messages[2], ToolMessage) and messages[2].result == "through x-0"
    assert len(agent.model.calls) == 1  # type: ignore[attr-defined]
    logged = [e.type for e in await session.events()]
    assert logged[-2:] == ["action.completed", "turn.cancelled"]
    assert sink.types()[-1] == "turn.cancelled"
    assert await session.status() == "idle"


async def test_a_batch_of_three_cancelled_after_the_first_gets_synthetic_results(
    open_runtime: Any, sink: RecordingSink
) -> None:
    gates = Gates()
    rt = await open_runtime(gated_agent(gates, calls=3, parallel=1))  # one after another
    session = rt.session("a", "s1")
    tid = session.start("x")
    await gates.reached.wait()
    await session.cancel()
    gates.release.set()
    assert (await session.result(tid)).status == "cancelled"
    messages = await session.messages()
    assert roles(messages) == ["user", "assistant", "tool", "tool", "tool"]
    first, second, third = messages[2:]
    assert isinstance(first, ToolMessage) and first.result == "through x-0"
    for synthetic in (second, third):
        assert isinstance(synthetic, ToolMessage) and synthetic.is_error
        assert synthetic.result == {"cancelled": True, "reason": "requested"}
    assert gates.ran == ["x-0"]  # the other two never ran
    completed = [e for e in sink.events if e.type == "action.completed"]
    assert len(completed) == 1  # none for the synthetic results
    # The transcript is valid for the next turn's model call: every call answered.
    model_calls = ScriptedModel(["next"])
    rt2 = await open_runtime(turnkit.Agent(name="b", model=model_calls), store=rt.store)
    assert await rt2.session("b", "s2").turn("hi") == "next"


class SlowStream:
    """A model whose stream yields one delta, waits, then tries to go on."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.go_on = asyncio.Event()
        self.closed = False
        self.yielded = 0

    async def stream(
        self, messages: Sequence[turnkit.Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        try:
            self.yielded += 1
            yield TextDelta(text="Thinking ")
            self.waiting.set()
            await self.go_on.wait()
            self.yielded += 1
            yield TextDelta(text="about it")
            self.yielded += 1
            yield TextDelta(text=" some more")
            reply = ModelReply(text="never", stop=StopReason(kind="end_turn"))
            yield ModelDone(reply=reply)
        finally:
            self.closed = True


async def test_a_model_stream_cancelled_between_deltas_is_closed_and_nothing_commits(
    open_runtime: Any, sink: RecordingSink
) -> None:
    model = SlowStream()
    rt = await open_runtime(turnkit.Agent(name="a", model=model))
    session = rt.session("a", "s1")
    tid = session.start("x")
    await model.waiting.wait()
    await session.cancel()
    model.go_on.set()
    result = await session.result(tid)
    assert result.status == "cancelled"
    # The stream stopped right after the delta that followed the cancel, and was closed.
    assert model.closed and model.yielded == 2
    assert roles(await session.messages()) == ["user"]
    assert "message.completed" not in [e.type for e in await session.events()]


# -- replace -------------------------------------------------------------------------


async def test_replace_cancels_the_running_and_both_queued_turns(
    open_runtime: Any,
) -> None:
    gates = Gates()
    rt = await open_runtime(gated_agent(gates))
    session = rt.session("a", "s1")
    t1 = session.start("one")
    t2 = session.start("two")
    t3 = session.start("three")
    await gates.reached.wait()
    t4 = session.start("four", replace=True)
    gates.release.set()
    results = {t: await session.result(t) for t in (t1, t2, t3, t4)}
    assert [(r.status, r.reason) for r in results.values()] == [
        ("cancelled", "replaced"),
        ("cancelled", "replaced"),
        ("cancelled", "replaced"),
        ("completed", None),
    ]
    messages = await session.messages()
    assert {m.turn_id for m in messages} == {t1, t4}  # the queued ones left no trace
    assert gates.ran == ["one-0", "four-0"]
    record = await session._store.turn(t1)
    assert record is not None and (record.status, record.cancel_reason) == (
        "cancelled",
        "replaced",
    )


async def test_replace_never_cancels_a_parked_approval(open_runtime: Any) -> None:
    @tool
    async def ask(ctx: ToolContext) -> str:
        """Asks a person."""
        return str(await ctx.request_input("ok", "ok?"))

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("ask")]), "done"])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[ask]))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("go"))
    assert parked.status == "suspended"
    with pytest.raises(turnkit.SessionSuspendedError):
        session.start("instead", replace=True)
    assert await session.status() == "suspended"
    assert (await session.pending()) == parked.request


# -- reset -----------------------------------------------------------------------------


async def cancelled_by_reset(session: turnkit.AgentSession, turn_id: str) -> None:
    """Wait until a reset has recorded its barrier: ``turn_id`` stored as cancelled
    by it (the turn itself unwinds later, at its next checkpoint)."""

    async def recorded() -> bool:
        record = await session.turn_record(turn_id)
        return record is not None and record.cancel_reason == "reset"

    await eventually(recorded, what=f"turn {turn_id} cancelled by the reset")


async def test_reset_while_running_cancels_then_archives(open_runtime: Any) -> None:
    gates = Gates()
    agent = gated_agent(gates)
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    gates.release.set()
    await session.turn("before")  # a finished turn in generation 0
    gates.release.clear()
    gates.reached.clear()
    running = session.start("during")
    await gates.reached.wait()
    resetting = asyncio.ensure_future(session.reset())
    await cancelled_by_reset(session, running)
    gates.release.set()
    result = await resetting
    assert result == turnkit.ResetResult(
        previous_session="s1#g0", archived_generation=0, generation=1
    )
    assert (await session.result(running)).reason == "reset"
    assert await session.messages() == [] and await session.status() == "new"
    archived = await session.archived_messages(0)
    assert roles(archived) == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
    ]
    assert [getattr(m, "text", None) for m in archived if m.role == "user"] == ["before", "during"]
    assert await session.generations() == [0]
    # The next turn starts from an empty transcript.
    await session.turn("after")
    sent = agent.model.calls[-2].messages  # type: ignore[attr-defined]
    assert [getattr(m, "text", None) for m in sent] == ["after"]


async def test_reset_while_queued_and_twice(open_runtime: Any) -> None:
    gates = Gates()
    rt = await open_runtime(gated_agent(gates))
    session = rt.session("a", "s1")
    t1 = session.start("one")
    t2 = session.start("two")
    await gates.reached.wait()
    resetting = asyncio.ensure_future(session.reset())
    await cancelled_by_reset(session, t1)
    t3 = session.start("three")  # new turns may queue behind the reset
    gates.release.set()
    first = await resetting
    assert first.previous_session == "s1#g0"
    assert (await session.result(t1)).reason == "reset"
    assert (await session.result(t2)).reason == "reset"
    assert (await session.result(t3)).status == "completed"
    assert {m.turn_id for m in await session.archived_messages(0)} == {t1}
    assert {m.turn_id for m in await session.messages()} == {t3}
    second = await session.reset()
    assert second == turnkit.ResetResult(
        previous_session="s1#g1", archived_generation=1, generation=2
    )
    assert await session.generations() == [0, 1]
    assert {m.turn_id for m in await session.archived_messages(1)} == {t3}
    assert await session.messages() == []


async def test_resetting_a_session_with_nothing_in_it_archives_nothing(
    open_runtime: Any,
) -> None:
    rt = await open_runtime(turnkit.Agent(name="a", model=ScriptedModel(["hi", "hi"])))
    fresh = rt.session("a", "never-used")
    nothing = turnkit.ResetResult(previous_session=None, archived_generation=None, generation=0)
    assert await fresh.reset() == nothing
    assert await fresh.generations() == [] and await fresh.status() == "new"
    assert [s.session_id for s in await rt.sessions()] == []  # not even a session row
    session = rt.session("a", "s1")
    await session.turn("hello")
    assert await session.reset() == turnkit.ResetResult(
        previous_session="s1#g0", archived_generation=0, generation=1
    )
    # Reset again before anything happened: generation 1 is empty, so it stays live.
    again = await session.reset()
    assert again == turnkit.ResetResult(
        previous_session=None, archived_generation=None, generation=1
    )
    assert await session.generations() == [0]
    await session.turn("hello again")
    assert (await session.reset()).previous_session == "s1#g1"
    assert await session.generations() == [0, 1]


async def test_reset_while_parked_archives_the_park_and_resume_then_conflicts(
    open_runtime: Any,
) -> None:
    @tool
    async def ask(ctx: ToolContext) -> str:
        """Asks a person."""
        return str(await ctx.request_input("ok", "ok?"))

    model = ScriptedModel(
        respond=lambda m: (
            ScriptedReply(tool_calls=[tool_call("ask")]) if m[-1].role == "user" else "done"
        )
    )
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[ask]))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("go"))
    assert parked.status == "suspended"
    assert (await session.reset()).archived_generation == 0
    assert await session.pending() is None and await session.status() == "new"
    with pytest.raises(turnkit.ResumeConflictError):
        await session.resume(parked.turn_id, "ok", True)
    archived = await session.archived_messages(0)
    assert roles(archived) == ["user", "assistant", "tool"]  # the park, closed as cancelled
    nxt = await session.result(session.start("again"))
    assert nxt.status == "suspended"  # a fresh turn with no parked approval before it


async def test_resume_is_refused_while_a_reset_is_pending(open_runtime: Any) -> None:
    gates = Gates()

    @tool
    async def ask(ctx: ToolContext) -> str:
        """Asks a person."""
        return str(await ctx.request_input("ok", "ok?"))

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("ask")]), "done"])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[ask, gates.tool()]))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("go"))
    begun = asyncio.Event()

    async def reset() -> turnkit.ResetResult:
        begun.set()  # in the same step as the reset's first, synchronous part
        return await session.reset()

    resetting = asyncio.ensure_future(reset())
    await begun.wait()
    with pytest.raises(turnkit.ResumeConflictError, match="reset pending"):
        await session.resume(parked.turn_id, "ok", True)
    await resetting


async def test_resume_is_refused_once_a_reset_elsewhere_is_recorded(open_runtime: Any) -> None:
    # A reset recorded in the store by a process that then died: every process
    # refuses to resume the parked turn it cancelled, and a later turn resets first.
    @tool
    async def ask(ctx: ToolContext) -> str:
        """Asks a person."""
        return str(await ctx.request_input("ok", "ok?"))

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("ask")]), "fresh"])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[ask]))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("go"))
    await rt.store.session("s1").commit([RequestReset()])
    with pytest.raises(turnkit.ResumeConflictError, match=r"cancelled \(reset\)"):
        await session.resume(parked.turn_id, "ok", True)
    # Nor is the session stuck on it: a new turn queues behind the reset, which the
    # delivery carries out first, ending the parked turn with the old generation.
    assert await session.turn("again") == "fresh"
    assert await session.turn_record(parked.turn_id) is None  # archived
    assert [m.role for m in await session.messages()] == ["user", "assistant"]
    assert await session.generations() == [0]
    assert {m.turn_id for m in await session.archived_messages(0)} == {parked.turn_id}


async def test_a_reset_that_fails_midway_leaves_the_old_generation_whole(
    make_store: Any, store_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if store_kind == "memory":
        pytest.skip("no trigger can make the in-memory store's reset fail midway")
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: "ok"))
    async with turnkit.Runtime(agent, store=make_store()) as rt:
        session = rt.session("a", "s1")
        await session.turn("one")
        before = [m.to_dict() for m in await session.messages()]
        # Make the reset's transaction fail after it archived the messages.
        if store_kind == "sqlite":
            conn = sqlite3.connect(tmp_path / "turnkit.db")
            conn.execute(
                "CREATE TRIGGER no_step_delete BEFORE DELETE ON turnkit_steps "
                "BEGIN SELECT RAISE(ABORT, 'refusing to delete steps'); END"
            )
            conn.commit()
            conn.close()
        else:
            import psycopg

            schema = request.getfixturevalue("pg_schema")
            with psycopg.connect(request.getfixturevalue("pg_dsn"), autocommit=True) as conn:
                conn.execute(
                    f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql '
                    "AS $$ BEGIN RAISE EXCEPTION 'refusing to delete steps'; END $$"
                )
                conn.execute(
                    f'CREATE TRIGGER no_step_delete BEFORE DELETE ON "{schema}".turnkit_steps '
                    f'FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse()'
                )
        with pytest.raises(turnkit.StoreError, match="refusing to delete steps"):
            await session.reset()
        assert [m.to_dict() for m in await session.messages()] == before
        assert await session.generations() == []
        assert await session.archived_messages(0) == []
        assert await session.status() == "idle"


# -- durable cancellation ----------------------------------------------------------------


@pytest.mark.parametrize("recovery", ["recover", "redeliver"])
async def test_a_cancel_recorded_before_a_kill_is_honoured_after_it(
    make_store: Any, store_kind: str, request: pytest.FixtureRequest, tmp_path: Path, recovery: str
) -> None:
    if store_kind == "memory":
        pytest.skip("the in-memory store does not outlive its process")
    if store_kind == "sqlite":
        spec = str(tmp_path / "turnkit.db")
    else:
        spec = (
            f"postgres:{request.getfixturevalue('pg_schema')}:{request.getfixturevalue('pg_dsn')}"
        )
    log = tmp_path / "tool.log"
    proc = subprocess.run(
        [sys.executable, str(CHILD), spec, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert log.read_text().splitlines() == ["ran"]

    @tool
    async def work(ctx: ToolContext) -> str:
        """Would run again if the cancellation were lost."""
        with open(log, "a") as f:
            f.write("ran\n")
        return "worked"

    model = ScriptedModel(respond=lambda m: "should not be asked")
    agent = turnkit.Agent(name="a", model=model, tools=[work])
    async with turnkit.Runtime(agent, store=make_store()) as rt:
        session = rt.session("a", "s1")
        if recovery == "recover":
            results = await rt.recover()
        else:
            results = [await session.result(session.start("go", turn_id="t-1"))]
        messages = await session.messages()
    assert [(r.status, r.reason) for r in results] == [("cancelled", "requested")]
    assert log.read_text().splitlines() == ["ran"]  # not run again
    assert model.calls == []
    assert roles(messages) == ["user", "assistant", "tool"]
    assert isinstance(messages[2], ToolMessage) and messages[2].result == {
        "cancelled": True,
        "reason": "requested",
    }


async def test_a_turn_started_while_a_reset_records_its_cancellation_runs_after_it(
    open_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gates = Gates()
    rt = await open_runtime(gated_agent(gates))
    session = rt.session("a", "s1")
    t1 = session.start("one")
    await gates.reached.wait()
    # A slow store: the reset is still recording its cancellation when t3 starts.
    store = rt.store.session("s1")
    recording, started = asyncio.Event(), asyncio.Event()
    unfinished = store.unfinished

    async def slow_unfinished() -> Any:
        recording.set()
        await started.wait()  # held until t3 has started
        return await unfinished()

    monkeypatch.setattr(session._store, "unfinished", slow_unfinished)
    resetting = asyncio.ensure_future(session.reset())
    await recording.wait()
    t3 = session.start("three")
    started.set()
    gates.release.set()
    assert (await resetting).archived_generation == 0
    assert (await session.result(t1)).reason == "reset"
    assert (await session.result(t3)).status == "completed"
    assert {m.turn_id for m in await session.messages()} == {t3}
    assert {m.turn_id for m in await session.archived_messages(0)} == {t1}


class HeldStream:
    """A model that answers in one delta, then is held either before it says it is
    done (``hold="after_delta"``) or after, while its stream closes (``"closing"``)."""

    def __init__(self, hold: str) -> None:
        self.hold = hold
        self.waiting = asyncio.Event()
        self.go_on = asyncio.Event()

    async def stream(
        self, messages: Sequence[turnkit.Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        try:
            yield TextDelta(text="The whole answer")
            if self.hold == "after_delta":
                self.waiting.set()
                await self.go_on.wait()
            yield ModelDone(reply=ModelReply(text="The whole answer"))
        finally:
            if self.hold == "closing":
                self.waiting.set()
                await self.go_on.wait()


@pytest.mark.parametrize("hold", ["after_delta", "closing"])
async def test_a_cancel_after_the_last_delta_or_while_the_stream_closes_wins(
    open_runtime: Any, sink: RecordingSink, hold: str
) -> None:
    model = HeldStream(hold)
    rt = await open_runtime(turnkit.Agent(name="a", model=model))
    session = rt.session("a", "s1")
    tid = session.start("x")
    await model.waiting.wait()
    await session.cancel()
    model.go_on.set()
    result = await session.result(tid)
    assert result.status == "cancelled"
    assert roles(await session.messages()) == ["user"]
    types = [e.type for e in await session.events()]
    assert "message.completed" not in types and "turn.completed" not in types
    assert types[-1] == "turn.cancelled"
