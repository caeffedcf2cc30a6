"""Load: 200 sessions x 3 turns, all 600 started before anything is awaited, on one store.

Every turn calls a local tool once and then answers with text naming its own input.
Turns on one session must run in start order and never mix with another session's;
on SQLite all sessions share one file (and one connection), and each local tool
writes an app row inside its step's transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from turnkit import (
    Agent,
    AgentSession,
    AssistantMessage,
    Message,
    ModelDelta,
    Runtime,
    Tool,
    ToolContext,
    ToolMessage,
    ToolSpec,
    TurnResult,
    UserMessage,
    tool,
)
from turnkit.stores import MemoryStore, SqliteStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

pytestmark = pytest.mark.slow

AGENT = "load"
SESSIONS = 200
TURNS = 3

_NOTES_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS notes ("
    "session_id TEXT NOT NULL, turn_id TEXT NOT NULL, text TEXT NOT NULL, "
    "PRIMARY KEY (session_id, turn_id))"
)


def make_note_tool(calls: list[str]) -> Tool:
    """The local ``note`` tool; ``calls`` gets the session id of each run, in run order."""

    @tool
    def note(text: str, ctx: ToolContext) -> dict[str, object]:
        """Write down `text` (local: joins the step transaction where the store has one)."""
        calls.append(ctx.session_id)
        if ctx.store.unwrap() is not None:
            ctx.store.execute(_NOTES_SCHEMA)
            ctx.store.execute(
                "INSERT INTO notes (session_id, turn_id, text) VALUES (?, ?, ?)",
                (ctx.session_id, ctx.turn_id, text),
            )
        return {"noted": text, "session": ctx.session_id}

    return note


def _opening(transcript: Sequence[Message]) -> UserMessage:
    for i in range(len(transcript) - 1, -1, -1):
        msg = transcript[i]
        if isinstance(msg, UserMessage):
            return msg
    raise AssertionError("the model was called without a user message")


def respond(transcript: Sequence[Message]) -> ScriptedReply:
    """Call ``note`` with the turn's input, then answer naming that input."""
    opening = _opening(transcript)
    last = transcript[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("note", {"text": opening.text})])
    if isinstance(last, ToolMessage) and not last.is_error:
        return ScriptedReply(text=f"done: {opening.text}")
    return ScriptedReply(text=f"UNEXPECTED after {last!r}")


class YieldingModel:
    """``ScriptedModel`` that first yields to the event loop a few times (0-2, fixed per
    call) so the 200 sessions' steps interleave in a scrambled but repeatable order."""

    def __init__(self) -> None:
        self.inner = ScriptedModel(respond=respond, record_calls=False)

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        key = f"{messages[-1].turn_id}:{len(messages)}".encode()
        for _ in range(zlib.crc32(key) % 3):
            await asyncio.sleep(0)  # not a wait: a model that yields a varying number of times
        async for delta in self.inner.stream(messages, tools, system=system):
            yield delta


@dataclass(frozen=True)
class Started:
    session: AgentSession
    turn_id: str
    text: str


def turn_text(s: int, t: int) -> str:
    return f"session {s} turn {t}"


def check_session(messages: list[Message], turns: list[Started]) -> None:
    """Exactly the session's own turns, in start order, four messages each."""
    assert len(messages) == 4 * len(turns), [m.turn_id for m in messages]
    for n, started in enumerate(turns):
        user, asked, answered, final = messages[4 * n : 4 * n + 4]
        where = f"{started.session.session_id} turn {n}"
        assert isinstance(user, UserMessage), where
        assert (user.turn_id, user.text) == (started.turn_id, started.text), where
        assert isinstance(asked, AssistantMessage), where
        assert asked.turn_id == started.turn_id, where
        assert len(asked.tool_calls) == 1, where
        call = asked.tool_calls[0]
        assert (call.name, call.input) == ("note", {"text": started.text}), where
        assert isinstance(answered, ToolMessage), where
        assert (answered.turn_id, answered.call_id, answered.is_error) == (
            started.turn_id,
            call.id,
            False,
        ), where
        assert answered.result == {
            "noted": started.text,
            "session": started.session.session_id,
        }, where
        assert isinstance(final, AssistantMessage), where
        assert final.turn_id == started.turn_id, where
        assert (final.tool_calls, final.text) == ((), f"done: {started.text}"), where


async def run_load(store: Store) -> None:
    tool_runs: list[str] = []
    agent = Agent(name=AGENT, model=YieldingModel(), tools=[make_note_tool(tool_runs)])
    async with Runtime([agent], store=store) as runtime:
        started: list[Started] = []
        # Turn-major: every session's first turn, then every second turn, ... so each
        # session's queue holds three turns before the first one has run at all.
        for t in range(TURNS):
            for s in range(SESSIONS):
                session = runtime.session(AGENT, f"s{s}")
                text = turn_text(s, t)
                started.append(Started(session, session.start(text), text))
        assert len(started) == SESSIONS * TURNS
        assert len({st.turn_id for st in started}) == len(started)

        results: list[TurnResult] = await asyncio.gather(
            *(st.session.result(st.turn_id) for st in started)
        )
        for st, result in zip(started, results, strict=True):
            assert result == TurnResult(
                turn_id=st.turn_id, status="completed", text=f"done: {st.text}"
            ), st.text

        assert len(tool_runs) == SESSIONS * TURNS
        # The sessions really ran side by side: one after another would switch
        # from one session to the next only SESSIONS - 1 times.
        switches = sum(a != b for a, b in pairwise(tool_runs))
        assert switches > SESSIONS, switches

        by_session: dict[str, list[Started]] = {}
        for st in started:
            by_session.setdefault(st.session.session_id, []).append(st)
        assert len(by_session) == SESSIONS
        for turns in by_session.values():
            session = turns[0].session
            check_session(await session.messages(), turns)
            assert await session.status() == "idle"
            for st in turns:
                # Read back from the store, not the in-process future.
                record = await store.session(session.session_id).turn(st.turn_id)
                assert record is not None
                assert (record.status, record.text) == ("completed", f"done: {st.text}")

        infos = await runtime.sessions()
        assert sorted(i.session_id for i in infos) == sorted(by_session)
        assert {(i.agent, i.status) for i in infos} == {(AGENT, "idle")}
        assert await store.unfinished_turns() == []


async def test_load_memory_store() -> None:
    await run_load(MemoryStore())


async def test_load_one_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "load.db"
    await run_load(SqliteStore(db))

    conn = sqlite3.connect(db)
    try:
        notes = conn.execute("SELECT session_id, turn_id, text FROM notes").fetchall()
        turns = dict(
            ((sid, tid), (status, opening_text))
            for sid, tid, status, opening_text in conn.execute(
                "SELECT session_id, turn_id, status, json_extract(opening, '$.text') "
                "FROM turnkit_turns"
            )
        )
        counts = dict(
            conn.execute(
                "SELECT json_extract(body, '$.role'), count(*) FROM turnkit_messages GROUP BY 1"
            ).fetchall()
        )
    finally:
        conn.close()
    total = SESSIONS * TURNS
    assert len(turns) == total
    assert {status for status, _ in turns.values()} == {"completed"}
    # One app row per turn, written by that turn's own tool call, with its own input.
    assert len(notes) == total
    assert {(sid, tid): text for sid, tid, text in notes} == {
        key: text for key, (_, text) in turns.items()
    }
    assert counts == {"user": total, "assistant": 2 * total, "tool": total}
