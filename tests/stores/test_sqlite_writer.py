"""One writer per SQLite store, first come first served (issue 29's failing turns).

A tool that holds its step open used to make other sessions' commits lose the race
for SQLite's lock until ``busy_timeout`` failed their turns; now they queue for the
store's one write connection, in order, and only another process's lock times out.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from eventually import eventually, eventually_blocking

import turnkit
from turnkit.stores import AppendMessage, SqliteStore, TurnRecord, turn_rules
from turnkit.stores._sqlite_writer import WriteTurns
from turnkit.stores.sqlite import CHECKPOINT_EVERY
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

DEADLINE = 30.0


async def _until(condition: Callable[[], bool], what: str) -> None:
    await eventually(condition, what=what, timeout=DEADLINE)


async def test_the_token_goes_to_tasks_and_threads_in_the_order_they_asked() -> None:
    turns = WriteTurns()
    await turns.take()  # held: everyone after this queues
    order: list[str] = []

    async def task(name: str) -> None:
        await turns.take()
        order.append(name)
        turns.release()

    def thread(name: str) -> None:
        turns.take_blocking()
        order.append(name)
        turns.release()

    started: list[asyncio.Task[None] | threading.Thread] = []
    for n in range(6):
        name = f"{'task' if n % 2 == 0 else 'thread'}{n}"
        if n % 2 == 0:
            started.append(asyncio.create_task(task(name)))
        else:
            worker = threading.Thread(target=thread, args=(name,))
            worker.start()
            started.append(worker)
        await _until(lambda n=n: turns.waiting == n + 1, f"{name} to queue")
    turns.release()
    for item in started:
        if isinstance(item, threading.Thread):
            await asyncio.to_thread(item.join, DEADLINE)
        else:
            await asyncio.wait_for(item, DEADLINE)
    assert order == ["task0", "thread1", "task2", "thread3", "task4", "thread5"]
    await turns.take()  # free again: taken at once
    turns.release()


async def test_a_task_cancelled_while_it_waits_neither_keeps_nor_loses_the_token() -> None:
    turns = WriteTurns()
    await turns.take()
    gave_up = asyncio.create_task(turns.take())
    await _until(lambda: turns.waiting == 1, "the task to queue")
    later = asyncio.create_task(turns.take())
    await _until(lambda: turns.waiting == 2, "the second task to queue")
    gave_up.cancel()
    await asyncio.gather(gave_up, return_exceptions=True)
    assert turns.waiting == 1  # it left the queue
    turns.release()
    await asyncio.wait_for(later, DEADLINE)  # the next in line got it
    turns.release()


async def test_a_task_cancelled_as_the_token_reaches_it_passes_it_on() -> None:
    turns = WriteTurns()
    await turns.take()
    first = asyncio.create_task(turns.take())
    await _until(lambda: turns.waiting == 1, "the first task to queue")
    second = asyncio.create_task(turns.take())
    await _until(lambda: turns.waiting == 2, "the second task to queue")
    turns.release()  # granted to ``first``, which has not run yet ...
    first.cancel()  # ... and is cancelled before it does
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, DEADLINE)
    turns.release()


async def test_a_tool_holding_its_step_past_the_busy_timeout_fails_no_other_session(
    tmp_path: Path,
) -> None:
    """One session's tool holds the write connection for longer than busy_timeout;
    the other sessions' commits wait their turn instead of failing."""
    db = tmp_path / "held.db"
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("CREATE TABLE notes (turn_id TEXT)")
    release = threading.Event()
    holding = threading.Event()

    def hold(ctx: turnkit.ToolContext) -> str:
        """Writes a note, then blocks inside its step until released."""
        ctx.store.execute("INSERT INTO notes VALUES (?)", (ctx.turn_id,))
        if ctx.session_id == "holder":
            holding.set()
            assert release.wait(DEADLINE)
        return "held"

    t = turnkit.tool(hold)

    def respond(messages: list[turnkit.Message]) -> ScriptedReply | str:
        if isinstance(messages[-1], turnkit.UserMessage):
            return ScriptedReply(tool_calls=[tool_call(t.name)])
        return "done"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[t])
    store = SqliteStore(db, busy_timeout=0.2)
    async with turnkit.Runtime(agent, store=store) as rt:
        holder = rt.session("a", "holder").start("go")
        await asyncio.wait_for(asyncio.to_thread(holding.wait, DEADLINE), DEADLINE)
        others = [rt.session("a", f"s{n}").start("go") for n in range(12)]
        await _until(lambda: store.writes_waiting >= 1, "another commit to queue")
        # Past the busy timeout on purpose: only another process's lock may time out.
        await asyncio.sleep(store.busy_timeout * 3)  # not a wait: the time under test
        release.set()
        results = [await rt.session("a", "holder").result(holder)]
        for n, tid in enumerate(others):
            results.append(await rt.session("a", f"s{n}").result(tid))
    assert [r.status for r in results] == ["completed"] * 13, [r.error for r in results]
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        assert conn.execute("SELECT count(*) FROM notes").fetchone() == (13,)


async def test_checkpoints_keep_running_while_the_event_loop_never_waits(tmp_path: Path) -> None:
    """A turn whose steps never wait (a fast model, async tools) keeps the loop busy;
    each background checkpoint must still start after the last one ended, or the WAL
    grows and every later commit slows (one checkpoint per store, before the fix)."""
    store = SqliteStore(tmp_path / "busy.db")
    async with turnkit.Runtime(turnkit.Agent(name="a", model=ScriptedModel(["x"])), store=store):
        session = store.session("s1")
        opening = turnkit.UserMessage(text="hi", turn_id="t1")
        record = TurnRecord(
            session_id="s1",
            turn_id="t1",
            agent="a",
            status="running",
            opening=opening,
            created_at=0.0,
        )
        await session.commit([AppendMessage(0, opening), turn_rules.new_turn(record)])
        index = 1
        for rounds in range(1, 4):
            for _ in range(CHECKPOINT_EVERY):
                reply = turnkit.AssistantMessage(text="y", turn_id="t1")
                await session.commit([AppendMessage(index, reply)])
                index += 1
            # Block the loop on purpose (it is what a busy loop looks like to the
            # checkpoint's thread) until this round's checkpoint has ended.
            eventually_blocking(
                lambda rounds=rounds: store.checkpoints >= rounds,
                what=f"checkpoint {rounds}",
                timeout=DEADLINE,
            )
