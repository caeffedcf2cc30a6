"""Retention (``turnkit.Retention``, ``runtime.prune``, ``turnkit prune``, a worker's
elected pruning): what aged out goes, what is unfinished never does, and the reads
that find it walk an index, also on 100,000 sessions."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from suite_paths import FIXTURES

import turnkit
from turnkit import ToolContext, ToolMessage, UserMessage, tool
from turnkit.stores import SqliteStore, all_sessions
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

DAY = 86400.0


def approving_agent() -> turnkit.Agent:
    """Answers plain text; ``ask ...`` parks on a question first."""

    @tool
    async def ask(what: str, ctx: ToolContext) -> str:
        """Ask a person."""
        return str(await ctx.request_input("ok", what, schema={"type": "string"}))

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.text.startswith("ask"):
            return ScriptedReply(tool_calls=[tool_call("ask", {"what": last.text})])
        if isinstance(last, ToolMessage):
            return f"answered {last.result}"
        return "done"

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[ask])


async def history(rt: turnkit.Runtime) -> None:
    """``done``: one finished turn; ``reset``: a reset (one archived generation) and a
    turn after it; ``parked``: waits for an answer; ``queued``: a submitted turn no
    process runs (as a node whose workers are all down would leave it)."""
    done = rt.session("a", "done")
    await done.result(done.start("hi"))
    reset = rt.session("a", "reset")
    await reset.result(reset.start("hi"))
    await reset.reset()
    await reset.result(reset.start("again"))
    parked = rt.session("a", "parked")
    assert (await parked.result(parked.start("ask me"))).status == "suspended"


async def test_prune_by_age_never_touches_what_is_unfinished(open_runtime: Any) -> None:
    keep = turnkit.Retention(archives_for=timedelta(days=30), sessions_idle_for=timedelta(days=90))
    rt = await open_runtime(approving_agent())
    rt.retention = keep
    await history(rt)
    now = time.time()

    report = await rt.prune(now=now)  # nothing is 30 days old yet
    assert (report.generations, report.sessions) == (0, 0)

    dry = await rt.prune(apply=False, now=now + 31 * DAY)
    assert (dry.applied, dry.generations, dry.sessions) == (False, 1, 0)
    assert await rt.store.session("reset").generations() == [0]  # a dry run deletes nothing

    report = await rt.prune(now=now + 31 * DAY)
    assert (report.generations, report.sessions) == (1, 0)
    assert await rt.store.session("reset").generations() == []
    assert len(await turnkit.stores.transcript(rt.store.session("reset"))) == 2  # live stays

    report = await rt.prune(now=now + 91 * DAY)
    assert (report.generations, report.sessions, report.kept) == (0, 2, 0)
    left = {i.session_id for i in await all_sessions(rt.store)}
    assert left == {"parked"}  # parked for 91 days, and still waiting: kept
    parked = rt.session("a", "parked")
    pending = await parked.pending()
    assert pending is not None
    done = await parked.result(await parked.resume(pending.turn_id, "ok", "yes"))
    assert done.status == "completed" and done.text == "answered yes"


async def test_a_session_used_again_after_it_was_listed_is_kept(open_runtime: Any) -> None:
    """The idleness is checked again in the deleting statement, under the session's
    writer lock: a session used between the listing and the deletion stays."""
    rt = await open_runtime(approving_agent())
    rt.retention = turnkit.Retention(sessions_idle_for=60)
    session = rt.session("a", "s1")
    await session.result(session.start("hi"))
    listed = await rt.store.idle_sessions(time.time() + 3600, limit=10)  # type: ignore[attr-defined]
    assert [sid for _, sid in listed] == ["s1"]
    await session.result(session.start("still here"))  # used again: updated now
    report = await rt.prune(now=time.time() + 30)  # cutoff before that use
    assert report.sessions == 0
    assert len(await turnkit.stores.transcript(rt.store.session("s1"))) == 4


def test_retention_refuses_nonsense() -> None:
    for bad in (
        {"archives_for": -1},
        {"sessions_idle_for": timedelta(0)},
        {"archives_for": "30d"},
        {"every": None},
        {"batch": 0},
        {"batch": True},
    ):
        with pytest.raises(turnkit.ConfigurationError, match="Retention"):
            turnkit.Retention(**bad)  # type: ignore[arg-type]


async def test_prune_without_retention_says_so(open_runtime: Any) -> None:
    rt = await open_runtime(approving_agent())
    with pytest.raises(turnkit.ConfigurationError, match="retention"):
        await rt.prune()


async def test_a_worker_prunes_while_it_leads(pg_dsn: str, pg_schema: str) -> None:
    from turnkit.stores import PostgresStore

    keep = turnkit.Retention(sessions_idle_for=0.001, every=0.05)
    store = PostgresStore(pg_dsn, schema=pg_schema)
    async with turnkit.Runtime(approving_agent(), store=store, retention=keep) as rt:
        session = rt.session("a", "old")
        await session.result(session.start("hi"))
        worker = turnkit.Worker(rt, poll=0.05)
        running = asyncio.create_task(worker.run())
        try:

            async def pruned() -> bool:
                assert not running.done(), running
                return (await store.session("old").load()).agent is None

            await eventually(pruned, what="the worker pruning the idle session")
        finally:
            worker.stop()
            await asyncio.wait_for(running, timeout=30)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_turnkit_prune_counts_then_applies(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with turnkit.Runtime(approving_agent(), store=SqliteStore(db)) as rt:
        await history(rt)
    with sqlite3.connect(db) as conn:  # as if all of it happened 100 days ago
        conn.execute("UPDATE turnkit_sessions SET updated_at = updated_at - ?", (100 * DAY,))
        conn.execute("UPDATE turnkit_generations SET archived_at = archived_at - ?", (100 * DAY,))
        conn.execute("UPDATE turnkit_turns SET finished_at = finished_at - ?", (100 * DAY,))

    dry = run_cli(
        "prune",
        "--store",
        str(db),
        "--archives-for",
        "30d",
        "--sessions-idle-for",
        "90d",
        "--keep-events-for",
        "30d",
    )
    assert dry.returncode == 0, dry.stderr
    assert "would delete" in dry.stdout, dry.stdout
    assert "1 archived generation(s), 2 idle session(s), the early events of 2" in dry.stdout

    applied = run_cli(
        "prune", "--store", str(db), "--sessions-idle-for", "90d", "--apply", "--json"
    )
    assert applied.returncode == 0, applied.stderr
    report = json.loads(applied.stdout)
    assert (report["applied"], report["sessions"], report["kept"]) == (True, 2, 0)
    with sqlite3.connect(db) as conn:
        left = [r[0] for r in conn.execute("SELECT session_id FROM turnkit_sessions")]
    assert left == ["parked"]

    for args, error in (
        ((), "say what to prune"),
        (("--archives-for", "soon"), "expected a duration"),
        (("--archives-for", "0d"), "above zero"),
    ):
        bad = run_cli("prune", "--store", str(db), *args)
        assert bad.returncode == 2 and error in bad.stderr, bad.stderr
    missing = run_cli("prune", "--store", str(tmp_path / "none.db"), "--archives-for", "1d")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


# -- the reads walk an index -------------------------------------------------------

SESSIONS = 100_000


@pytest.mark.slow
def test_sqlite_finds_what_aged_out_from_an_index(tmp_path: Path) -> None:
    from turnkit.stores._retention_sql import ENDED_TURNS, IDLE_SESSIONS, OLD_GENERATIONS

    db = tmp_path / "big.db"

    async def create() -> None:
        store = SqliteStore(db)
        await store.open()
        await store.close()

    asyncio.run(create())
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at) "
            "VALUES (?, 'a', 'idle', ?, ?)",
            ((f"s{i}", float(i), float(i)) for i in range(SESSIONS)),
        )
        conn.executemany(
            "INSERT INTO turnkit_generations (session_id, generation, archived_at) "
            "VALUES (?, 0, ?)",
            ((f"s{i}", float(i)) for i in range(SESSIONS)),
        )
        conn.executemany(
            "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, "
            "created_at, finished_at) VALUES (?, 't', 'a', 'completed', '{}', ?, ?)",
            ((f"s{i}", float(i), float(i)) for i in range(SESSIONS)),
        )
        conn.execute("ANALYZE")
        for query, params, index in (
            (IDLE_SESSIONS, (50_000.0, -1.0, "", 200), "turnkit_sessions_idle"),
            (OLD_GENERATIONS, (50_000.0, -1.0, "", -1, 200), "turnkit_generations_age"),
            (ENDED_TURNS, (50_000.0, -1.0, "", "", 200), "turnkit_turns_untrimmed"),
        ):
            plan = " | ".join(r[-1] for r in conn.execute(f"EXPLAIN QUERY PLAN {query}", params))
            assert f"USING INDEX {index}" in plan or f"USING COVERING INDEX {index}" in plan, plan
            assert "TEMP B-TREE" not in plan and "SCAN " not in plan, plan
            assert len(conn.execute(query, params).fetchall()) == 200


@pytest.mark.slow
def test_postgres_finds_what_aged_out_from_an_index(pg_dsn: str, pg_schema: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from turnkit.stores._retention_sql import ENDED_TURNS, IDLE_SESSIONS, OLD_GENERATIONS
    from turnkit.stores.postgres import qmark_to_pyformat
    from turnkit.stores.postgres._schema import migrate

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, pg_schema)
        conn.execute(f'SET search_path TO "{pg_schema}"')
        conn.execute(
            "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at) "
            "SELECT 's' || i, 'a', 'idle', i, i FROM generate_series(1, %s) AS i",
            (SESSIONS,),
        )
        conn.execute(
            "INSERT INTO turnkit_generations (session_id, generation, archived_at) "
            "SELECT 's' || i, 0, i FROM generate_series(1, %s) AS i",
            (SESSIONS,),
        )
        conn.execute(
            "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, "
            "created_at, finished_at) "
            "SELECT 's' || i, 't', 'a', 'completed', '{}', i, i FROM generate_series(1, %s) AS i",
            (SESSIONS,),
        )
        conn.execute("ANALYZE")
        for query, params, index in (
            (IDLE_SESSIONS, (50_000.0, -1.0, "", 200), "turnkit_sessions_idle"),
            (OLD_GENERATIONS, (50_000.0, -1.0, "", -1, 200), "turnkit_generations_age"),
            (ENDED_TURNS, (50_000.0, -1.0, "", "", 200), "turnkit_turns_untrimmed"),
        ):
            sql = qmark_to_pyformat(query)
            plan = json.dumps(conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()[0])
            assert index in plan, plan
            assert '"Seq Scan"' not in plan or '"Relation Name": "turnkit_turns"' in plan, plan
            assert len(conn.execute(sql, params).fetchall()) == 200


async def test_an_ended_turns_events_are_cut_to_its_ending(open_runtime: Any) -> None:
    rt = await open_runtime(approving_agent())
    rt.retention = turnkit.Retention(keep_events_for=timedelta(days=7))
    session = rt.session("a", "s1")
    first = await session.result(session.start("ask once"))
    done = await session.result(await session.resume(first.turn_id, "ok", "fine"))
    assert done.status == "completed"
    store = rt.store.session("s1")
    before = await store.events(turn_id=done.turn_id)
    assert len(before) > 2 and before[-1].type == "turn.completed"
    next_seq = (await store.load()).next_seq

    assert (await rt.prune(now=time.time() + DAY)).trimmed == 0  # not a week old yet
    report = await rt.prune(now=time.time() + 8 * DAY)
    assert report.trimmed == 1
    assert await store.events(turn_id=done.turn_id) == [before[-1]]
    assert (await store.load()).next_seq == next_seq  # numbering goes on where it was
    assert len(await turnkit.stores.transcript(store)) == 4  # the transcript stays
    assert (await rt.prune(now=time.time() + 8 * DAY)).trimmed == 0  # once

    # Asked again for the same turn, the session still says how it ended.
    again = await session.result(session.start("ask once", turn_id=done.turn_id))
    assert again.status == "completed" and again.text == done.text
    later = await session.result(session.start("hi"))
    assert later.status == "completed"
    assert next(e.seq for e in await store.events(turn_id=later.turn_id)) == next_seq


async def test_turnkit_worker_prunes_by_its_retention_flags(pg_dsn: str, pg_schema: str) -> None:
    from cli_support import OFFLINE_ENV

    from turnkit.stores import PostgresStore

    store = PostgresStore(pg_dsn, schema=pg_schema)
    async with turnkit.Runtime(approving_agent(), store=store) as rt:
        session = rt.session("a", "old")
        await session.result(session.start("hi"))
        folder = FIXTURES / "streaming_agent"
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turnkit.cli",
                "worker",
                str(folder),
                "--store",
                f"{pg_dsn}?options=-csearch_path%3D{pg_schema}",
                "--sessions-idle-for",
                "0.001",
                "--prune-every",
                "0.05",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=OFFLINE_ENV,
        )
        try:

            async def pruned() -> bool:
                assert worker.poll() is None, "the worker exited"
                return (await store.session("old").load()).agent is None

            await eventually(pruned, what="the worker pruning the idle session", timeout=60)
        finally:
            worker.terminate()
            await asyncio.to_thread(worker.wait, 30)
