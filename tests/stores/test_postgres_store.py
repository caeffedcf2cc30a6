"""PostgresStore specifics: migrations, the SQL handle, the event loop, the single
writer across processes, and connection loss in the middle of a turn.

Everything here talks to the real server named by ``TURNKIT_TEST_POSTGRES_DSN``, in
a schema of the test's own (see ``conftest.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually, eventually_blocking
from round_trips import RoundTrips
from suite_paths import CHILDREN

import turnkit
from turnkit import AssistantMessage, ToolContext, UserMessage, tool
from turnkit.stores import all_sessions, transcript
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

psycopg = pytest.importorskip("psycopg", reason="PostgreSQL tests need turnkit[postgres]")

from turnkit.stores import (  # noqa: E402
    AppendMessage,
    LogEvent,
    PostgresStore,
    RequestCancel,
    TurnRecord,
    Write,
    turn_rules,
)
from turnkit.stores import _sql as sql_text  # noqa: E402
from turnkit.stores.postgres import _store as pg_store_module  # noqa: E402
from turnkit.stores.postgres import qmark_to_pyformat  # noqa: E402
from turnkit.stores.postgres._schema import MIGRATIONS, SCHEMA_VERSION, migrate  # noqa: E402

CHILD = CHILDREN / "pg_writer_child.py"


def connect(dsn: str) -> Any:
    return psycopg.connect(dsn, autocommit=True)


async def counting_proxy(pg_dsn: str) -> tuple[RoundTrips, str]:
    """A started counting proxy to the test server, and the DSN that goes through it
    (without TLS, so that it can read the replies); skips on a Unix-socket server."""
    with connect(pg_dsn) as conn:
        host, port = conn.info.host, conn.info.port
    if host.startswith("/"):
        pytest.skip("the round-trip proxy speaks TCP; the test server is on a Unix socket")
    proxy = RoundTrips(host, port)
    proxied = psycopg.conninfo.make_conninfo(
        pg_dsn, host="127.0.0.1", port=await proxy.start(), sslmode="disable"
    )
    return proxy, proxied


@pytest.fixture
async def store(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_dsn, schema=pg_schema)
    await s.open()
    yield s
    await s.close()


def one_tool_agent(fn: Any, *, then: str = "done") -> turnkit.Agent:
    t = tool(fn)

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call(t.name)])
        return then

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[t])


# -- schema -----------------------------------------------------------------------------


async def test_open_creates_the_schema_at_the_current_version(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    with connect(pg_dsn) as conn:
        row = conn.execute(f'SELECT version FROM "{pg_schema}".turnkit_schema').fetchone()
        assert row == (SCHEMA_VERSION,)


async def test_each_schema_gets_its_own_identity_and_keeps_it(
    store: PostgresStore, pg_dsn: str, pg_schema: str
) -> None:
    again = PostgresStore(pg_dsn, schema=pg_schema)
    await again.open()
    try:
        assert again.store_id == store.store_id and len(store.store_id) == 32
    finally:
        await again.close()
    other_schema = f"{pg_schema}_other"
    other = PostgresStore(pg_dsn, schema=other_schema)
    try:
        await other.open()
        assert other.store_id != store.store_id
    finally:
        await other.close()
        with connect(pg_dsn) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{other_schema}" CASCADE')


def test_migrating_while_an_app_creates_the_same_schema(pg_dsn: str, pg_schema: str) -> None:
    """An app's own setup (``CREATE SCHEMA IF NOT EXISTS``, as the deploy example's
    HTTP node runs it) may create the schema at the very moment a worker migrates it:
    the migration loses that race quietly and carries on in the schema it found."""
    with connect(pg_dsn) as app, connect(pg_dsn) as worker:
        app.execute("BEGIN")
        app.execute(f'CREATE SCHEMA "{pg_schema}"')  # not committed: invisible to others
        worker_pid = worker.info.backend_pid
        done: list[int | BaseException] = []

        def run() -> None:
            try:
                done.append(migrate(worker, pg_schema))
            except BaseException as exc:
                done.append(exc)

        migrating = threading.Thread(target=run)
        migrating.start()
        # The migration saw no schema and now waits on the app's uncommitted one.
        with connect(pg_dsn) as watcher:

            def waiting() -> bool:
                assert migrating.is_alive(), done
                query = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
                return watcher.execute(query, (worker_pid,)).fetchone() is not None

            eventually_blocking(waiting, what="the migration waiting on the app's schema")
        app.execute("COMMIT")
        migrating.join(timeout=30)
        assert done == [SCHEMA_VERSION]


def test_migrations_run_forward_from_any_version_and_only_once(pg_dsn: str, pg_schema: str) -> None:
    extra = [*MIGRATIONS, ("ALTER TABLE turnkit_sessions ADD COLUMN note text",)]
    with connect(pg_dsn) as conn:
        assert migrate(conn, pg_schema) == SCHEMA_VERSION
        conn.execute(
            f'INSERT INTO "{pg_schema}".turnkit_sessions '
            "(session_id, agent, status, created_at, updated_at) VALUES ('s', 'a', 'idle', 0, 0)"
        )
        assert migrate(conn, pg_schema, extra) == SCHEMA_VERSION + 1
        assert migrate(conn, pg_schema, extra) == SCHEMA_VERSION + 1
        rows = conn.execute(f'SELECT session_id, note FROM "{pg_schema}".turnkit_sessions')
        assert rows.fetchall() == [("s", None)]


async def test_sessions_from_before_owners_have_none_and_stay_usable(
    pg_dsn: str, pg_schema: str
) -> None:
    with connect(pg_dsn) as conn:
        assert migrate(conn, pg_schema, MIGRATIONS[:5]) == 5  # written before owners were kept
        conn.execute(
            f'INSERT INTO "{pg_schema}".turnkit_sessions '
            "(session_id, agent, status, created_at, updated_at) VALUES ('old', 'a', 'idle', 0, 0)"
        )
    store = PostgresStore(pg_dsn, schema=pg_schema)
    await store.open()
    try:
        assert [(i.session_id, i.owner) for i in await all_sessions(store)] == [("old", None)]
        assert (await store.session("old").load()).owner is None
        assert await store.session_page(limit=5, owner="alice") == []
    finally:
        await store.close()


def test_a_newer_schema_is_refused_and_a_failed_migration_changes_nothing(
    pg_dsn: str, pg_schema: str
) -> None:
    with connect(pg_dsn) as conn:
        migrate(conn, pg_schema)
        broken = [*MIGRATIONS, ("CREATE TABLE fine (x integer)", "THIS IS NOT SQL")]
        with pytest.raises(psycopg.errors.SyntaxError):
            migrate(conn, pg_schema, broken)
        assert conn.execute(f'SELECT version FROM "{pg_schema}".turnkit_schema').fetchone() == (
            SCHEMA_VERSION,
        )
        found = conn.execute(
            "SELECT count(*) FROM information_schema.tables "
            "WHERE table_schema = %s AND table_name = 'fine'",
            (pg_schema,),
        ).fetchone()
        assert found == (0,)
        # A newer turnkit's additive migrations: it records that this one may go on.
        conn.execute(f'UPDATE "{pg_schema}".turnkit_schema SET version = 99')
        assert migrate(conn, pg_schema) == 99
        # One this turnkit cannot live with: refused, not misread.
        conn.execute(f'UPDATE "{pg_schema}".turnkit_schema SET readable_from = 98')
        with pytest.raises(turnkit.StoreError, match="version 99, newer than this turnkit"):
            migrate(conn, pg_schema)


async def test_many_stores_opening_at_once_migrate_exactly_once(
    pg_dsn: str, pg_schema: str
) -> None:
    stores = [PostgresStore(pg_dsn, schema=pg_schema) for _ in range(6)]
    await asyncio.gather(*(s.open() for s in stores))
    for s in stores:
        await s.close()
    with connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT version FROM "{pg_schema}".turnkit_schema').fetchone() == (
            SCHEMA_VERSION,
        )


@pytest.mark.parametrize(
    "query",
    [
        "SELECT body FROM turnkit_messages WHERE session_id = 'x' ORDER BY idx",
        "SELECT step_id, result FROM turnkit_steps WHERE session_id = 'x' AND turn_id = 't'",
        "SELECT max(seq) FROM turnkit_events WHERE session_id = 'x'",
        "SELECT body FROM turnkit_events WHERE session_id = 'x' AND turn_id = 't' AND seq > 0",
        "SELECT status FROM turnkit_turns WHERE session_id = 'x' AND turn_id = 't'",
        "SELECT turn_id FROM turnkit_turns WHERE status = 'running' ORDER BY created_at",
        "SELECT seq FROM turnkit_archived_events WHERE session_id = 'x' "
        "ORDER BY generation DESC, seq DESC LIMIT 1",
        "SELECT session_id FROM turnkit_sessions WHERE agent = 'a' AND (updated_at < 5 "
        "OR (updated_at = 5 AND session_id > 's')) ORDER BY updated_at DESC, session_id LIMIT 3",
    ],
)
async def test_every_session_query_can_use_an_index(
    store: PostgresStore, pg_dsn: str, pg_schema: str, query: str
) -> None:
    with connect(pg_dsn) as conn:
        conn.execute(f'SET search_path TO "{pg_schema}"')
        conn.execute("SET enable_seqscan = off")  # tiny tables: ask what is possible
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {query}"))
    assert "Index" in plan and "Seq Scan" not in plan, plan


@pytest.mark.parametrize("query", [f"SELECT {sql_text.PG_ORDER}", sql_text.UNFINISHED])
async def test_what_a_submission_reads_does_not_grow_with_the_sessions_turns(
    store: PostgresStore, pg_dsn: str, pg_schema: str, query: str
) -> None:
    """A submission reads its session's latest turn (the new one goes after it) and
    its unfinished turns. Both read a few index entries, not every turn the session
    ever had (they did: 4 ms a submission at 20,000 turns, and growing)."""
    from turnkit.stores.postgres._statements import pg

    with connect(pg_dsn) as conn:
        conn.execute(f'SET search_path TO "{pg_schema}"')
        conn.execute(
            "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, "
            "created_at, finished_at) SELECT 'long', 't' || n, 'a', 'completed', '{}', n, n "
            "FROM generate_series(1, 5000) n"
        )
        conn.execute("ANALYZE turnkit_turns")
        explained = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + pg(query, pg_schema)
        (plan,) = conn.execute(explained, ("long",)).fetchone()
    top = plan[0]["Plan"]
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] <= 10, plan


def _turns_indexes(plan: dict[str, Any]) -> list[str]:
    """The index each node of ``plan`` (EXPLAIN's JSON) reads ``turnkit_turns`` by
    (``"none"`` for a node that reads it whole)."""
    found = []
    if plan.get("Relation Name") == "turnkit_turns":
        found.append(str(plan.get("Index Name", "none")))
    for child in plan.get("Plans", []):
        found += _turns_indexes(child)
    return found


@pytest.mark.parametrize("planned", ["generic", "auto"])
async def test_a_sessions_turns_are_read_by_the_right_index_on_plans_made_without_statistics(
    store: PostgresStore, pg_dsn: str, pg_schema: str, planned: str
) -> None:
    """A prepared statement keeps the plan it was given until its tables are next
    analyzed, and a plan made before they had statistics (a new schema; autovacuum
    off or not run yet) took the index of a session's turns by time, smaller than
    the primary key, to find one turn by its session and id: a delivery's load and a
    turn's read went through every turn of the session. Prepared on empty tables, as
    the lock connection plans (one generic plan) and as the pool's do (custom plans
    first), and used once the session has 5,000 turns: the turn comes by its primary
    key, the latest turn (a new one goes after it) by time, the unfinished ones by
    their own index."""
    from turnkit.stores.postgres._statements import LOAD_SQL, pg_wire
    from turnkit.stores.postgres._writer import LOCK_SESSION

    load_values = ("long", "long", "long", "long", 0, "long", "t7", "long", "long", "t7")
    cases = [
        (LOAD_SQL, load_values, "turnkit_turns_pkey"),
        (sql_text.TURN, ("long", "t7"), "turnkit_turns_pkey"),
        (f"SELECT {sql_text.PG_ORDER}", ("long",), "turnkit_turns_by_session"),
        (sql_text.UNFINISHED, ("long",), "turnkit_turns_unfinished"),
    ]
    with psycopg.connect(pg_dsn, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        if planned == "generic":
            for setting in LOCK_SESSION:
                conn.execute(setting)
        for n, (statement, values, _) in enumerate(cases):  # planned on empty tables
            marks = ", ".join(["%s"] * len(values))
            conn.execute(f"PREPARE q{n} AS ".encode() + pg_wire(statement, pg_schema))
            for _ in range(6):  # past the custom plans PostgreSQL tries first
                conn.execute(f"EXECUTE q{n}({marks})", values)
        conn.execute(
            f'INSERT INTO "{pg_schema}".turnkit_turns (session_id, turn_id, agent, status, '
            "opening, created_at, finished_at) SELECT 'long', 't' || n, 'a', 'completed', "
            "'{}', n, n FROM generate_series(1, 5000) n"
        )
        for n, (statement, values, index) in enumerate(cases):
            marks = ", ".join(["%s"] * len(values))
            rows = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE q{n}({marks})", values)
            (plan,) = rows.fetchone()
            assert _turns_indexes(plan[0]["Plan"]) == [index], (statement[:40], plan)


async def test_clear_errors_for_bad_configuration(pg_dsn: str) -> None:
    with pytest.raises(turnkit.ConfigurationError, match="plain identifier"):
        PostgresStore(pg_dsn, schema="bad-name; drop")
    with pytest.raises(turnkit.ConfigurationError, match="min_size <= max_size"):
        PostgresStore(pg_dsn, min_size=5, max_size=2)
    with pytest.raises(turnkit.ConfigurationError, match="commit_senders"):
        PostgresStore(pg_dsn, commit_senders=0)
    with pytest.raises(turnkit.StoreError, match="cannot open the database"):
        await PostgresStore(
            "postgresql://127.0.0.1:5432/no_such_database_here", connect_timeout=3
        ).open()
    with pytest.raises(turnkit.StoreError, match="not open"):
        await transcript(PostgresStore(pg_dsn).session("s1"))


# -- the SQL handle -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT ?", "SELECT %s"),
        ("SELECT '?', ?", "SELECT '?', %s"),
        ("SELECT 'it''s ?' || ?", "SELECT 'it''s ?' || %s"),
        ('SELECT "odd?col" FROM t WHERE a = ?', 'SELECT "odd?col" FROM t WHERE a = %s'),
        ("SELECT 1 -- why?\n, ?", "SELECT 1 -- why?\n, %s"),
        ("SELECT /* ? */ ?", "SELECT /* ? */ %s"),
        ("SELECT $$ ? $$, $tag$ ? $tag$, ?", "SELECT $$ ? $$, $tag$ ? $tag$, %s"),
        ("SELECT 5 % 2, ? LIKE 'a%'", "SELECT 5 %% 2, %s LIKE 'a%%'"),
    ],
)
def test_qmark_placeholders_become_psycopg_ones_outside_quotes(sql: str, expected: str) -> None:
    assert qmark_to_pyformat(sql) == expected


async def test_handle_is_the_psycopg_connection_inside_the_step_transaction(
    store: PostgresStore,
) -> None:
    seen: dict[str, Any] = {}

    def inspect_handle(ctx: ToolContext) -> str:
        """Looks at ctx.store."""
        conn = ctx.store.unwrap()
        seen["type"] = type(conn).__module__.split(".")[0]
        seen["status"] = conn.info.transaction_status.name
        ctx.store.execute("CREATE TABLE app_rows (k text PRIMARY KEY, v integer)")
        ctx.store.execute("INSERT INTO app_rows VALUES (?, ?)", ("a", 1))
        seen["rows"] = ctx.store.execute("SELECT k, v FROM app_rows WHERE v > ?", (0,))
        return "ok"

    async with turnkit.Runtime(one_tool_agent(inspect_handle), store=store) as rt:
        assert await rt.session("a", "s1").turn("go") == "done"
    assert seen == {"type": "psycopg", "status": "INTRANS", "rows": [("a", 1)]}


async def test_a_failed_statement_is_undone_alone_and_can_be_caught(store: PostgresStore) -> None:
    def careful(ctx: ToolContext) -> str:
        """Inserts, hits a duplicate, carries on (as SQLite allows)."""
        ctx.store.execute("CREATE TABLE app_rows (k text PRIMARY KEY)")
        ctx.store.execute("INSERT INTO app_rows VALUES (?)", ("a",))
        with contextlib.suppress(psycopg.errors.UniqueViolation):
            ctx.store.execute("INSERT INTO app_rows VALUES (?)", ("a",))
        ctx.store.execute("INSERT INTO app_rows VALUES (?)", ("b",))
        return "ok"

    async with turnkit.Runtime(one_tool_agent(careful), store=store) as rt:
        assert await rt.session("a", "s1").turn("go") == "done"
    with connect(store.dsn) as conn:
        rows = conn.execute(f'SELECT k FROM "{store.schema}".app_rows ORDER BY k').fetchall()
    assert rows == [("a",), ("b",)]


async def test_a_tool_error_rolls_back_its_rows_with_the_step(store: PostgresStore) -> None:
    def half_done(ctx: ToolContext) -> str:
        """Writes, then fails."""
        ctx.store.execute("CREATE TABLE app_rows (k text PRIMARY KEY)")
        ctx.store.execute("INSERT INTO app_rows VALUES (?)", ("a",))
        raise RuntimeError("boom after writing")

    async with turnkit.Runtime(one_tool_agent(half_done), store=store) as rt:
        session = rt.session("a", "s1")
        assert await session.turn("go") == "done"
        result = (await session.messages())[2]
    assert isinstance(result, turnkit.ToolMessage) and result.is_error
    with connect(store.dsn) as conn:
        found = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s "
            "AND table_name = 'app_rows'",
            (store.schema,),
        ).fetchone()
    assert found == (0,)  # even the CREATE TABLE rolled back with the step


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("ctx.store.execute('COMMIT')", "refused COMMIT"),
        ("ctx.store.execute('begin')", "refused BEGIN"),
        ("ctx.store.unwrap().execute('COMMIT')", "ended the step's transaction"),
        ("swallow(ctx)", "left the step's transaction aborted"),
    ],
)
async def test_tools_that_break_the_transaction_fail_the_turn_cleanly(
    store: PostgresStore, body: str, error: str
) -> None:
    def swallow(ctx: ToolContext) -> None:
        conn = ctx.store.unwrap()
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")

    def breaker(ctx: ToolContext) -> str:
        """Misuses the handle."""
        ctx.store.execute("CREATE TABLE IF NOT EXISTS app_rows (k text)")
        eval(body, {"ctx": ctx, "swallow": swallow})
        return "ok"

    async with turnkit.Runtime(one_tool_agent(breaker), store=store) as rt:
        session = rt.session("a", "s1")
        result = await session.result(session.start("go"))
        assert result.status == "failed" and error in (result.error or ""), result
        assert await session.status() == "idle"


# -- the event loop -------------------------------------------------------------------


async def test_a_session_waiting_on_postgres_does_not_hold_up_other_sessions(
    store: PostgresStore,
) -> None:
    finished: list[str] = []

    def slow(ctx: ToolContext) -> str:
        """Waits on the server for a while."""
        ctx.store.execute("SELECT pg_sleep(0.6)")
        return "slept"

    sleeper = one_tool_agent(slow)
    quick = turnkit.Agent(name="q", model=ScriptedModel(respond=lambda m: "quick"))
    async with turnkit.Runtime([sleeper, quick], store=store) as rt:

        async def run_slow() -> None:
            await rt.session("a", "sleeper").turn("go")
            finished.append("sleeper")

        async def run_quick(session_id: str) -> None:
            session = rt.session("q", session_id)
            for i in range(5):
                await session.turn(f"quick {i}")
            finished.append(session_id)

        await asyncio.gather(run_slow(), *(run_quick(f"quick-{i}") for i in range(3)))
    # Fifteen turns of three other sessions finished while one step slept on the server.
    assert finished[-1] == "sleeper", finished


async def test_a_local_tool_runs_exactly_once_on_a_worker_thread(store: PostgresStore) -> None:
    """Engine-only commits stay on the event loop; a local tool's step (``run_tool``)
    runs on a worker thread, once: no tool code ever runs on the loop, and none runs
    twice (each tool body here runs once per call)."""
    loop_thread = threading.get_ident()
    runs: list[tuple[str, bool]] = []

    def pure(ctx: ToolContext) -> str:
        """Never touches ctx.store."""
        runs.append(("pure", threading.get_ident() == loop_thread))
        return "pure"

    def writes(ctx: ToolContext) -> str:
        """Writes an app row."""
        runs.append(("writes", threading.get_ident() == loop_thread))
        ctx.store.execute("CREATE TABLE IF NOT EXISTS app_rows (k text)")
        ctx.store.execute("INSERT INTO app_rows VALUES (?)", (ctx.call_id,))
        return "written"

    tools = [tool(pure), tool(writes)]

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("pure"), tool_call("writes")])
        return "done"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=tools)
    async with turnkit.Runtime(agent, store=store) as rt:
        session = rt.session("a", "s1")
        for _ in range(3):
            assert await session.turn("go") == "done"
        results = [m.result for m in await session.messages() if isinstance(m, turnkit.ToolMessage)]
    assert runs == [("pure", False), ("writes", False)] * 3
    assert results == ["pure", "written"] * 3
    with connect(store.dsn) as conn:
        rows = conn.execute(f'SELECT count(*) FROM "{store.schema}".app_rows').fetchone()
    assert rows == (3,)


async def test_a_tool_steps_commit_runs_prepared_even_after_a_tool_drops_them(
    pg_dsn: str, pg_schema: str
) -> None:
    """A ``def`` tool's step commit goes on libpq directly, its statements prepared on
    the tools' connection once seen before (the server parses them once per
    connection); a tool that drops the connection's prepared statements (DEALLOCATE)
    still commits, and so do the steps after it."""
    seen: list[int] = []

    def writes(ctx: ToolContext) -> str:
        """Writes an app row; the third call drops the prepared statements."""
        ctx.store.execute("CREATE TABLE IF NOT EXISTS app_rows (k text)")
        ctx.store.execute("INSERT INTO app_rows VALUES (?)", (ctx.call_id,))
        mine = "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'turnkit\\_c%'"
        seen.append(ctx.store.execute(mine)[0][0])
        if len(seen) == 3:
            ctx.store.unwrap().execute("DEALLOCATE ALL")
        return "written"

    store = PostgresStore(pg_dsn, schema=pg_schema, max_size=1)  # one tools' connection
    async with turnkit.Runtime(one_tool_agent(writes), store=store) as rt:
        session = rt.session("a", "s1")
        for _ in range(6):
            assert await session.turn("go") == "done"
    assert seen[0] == 0 and seen[2] > 0  # prepared by the second step's commit
    assert seen[3] == 0 and seen[4] > 0  # dropped by the third, prepared again
    with connect(pg_dsn) as conn:
        rows = conn.execute(f'SELECT count(*) FROM "{pg_schema}".app_rows').fetchone()
    assert rows == (6,)


async def test_a_tool_step_runs_once_and_its_writes_land_once(store: PostgresStore) -> None:
    """The step is called once, and its writes land once, in its transaction."""
    session = store.session("s1")
    passes: list[str] = []

    def step(handle: Any) -> tuple[list[tuple[Any, ...]], list[Write]]:
        passes.append("ran")
        event = turnkit.TurnStartedEvent(turn_id="t1", session_id="s1", text="x", seq=1)
        return handle.execute("SELECT 1"), [LogEvent(event)]

    assert await session.run_tool(step) == [(1,)]
    assert passes == ["ran"]
    assert [e.seq for e in await session.events()] == [1]


async def test_concurrent_commits_are_grouped_yet_fail_only_where_they_fail(
    pg_dsn: str, pg_schema: str
) -> None:
    """With one sender, commits of many sessions that arrive together go out as one
    transaction; a commit that is refused (a taken position, a lost writer token)
    fails alone, and every other one in its group still lands, once."""
    store = PostgresStore(pg_dsn, schema=pg_schema, commit_senders=1)  # groups form
    await store.open()
    try:
        sessions = [store.session(f"s{i}") for i in range(30)]
        said = UserMessage(text="x", turn_id="t")

        def opening(sid: str) -> list[Write]:
            record = TurnRecord(
                session_id=sid, turn_id="t", agent="a", status="running", opening=said
            )
            return [AppendMessage(0, said), turn_rules.new_turn(record)]

        await asyncio.gather(*(s.commit(opening(s.session_id)) for s in sessions))
        store.faults.lose_writer("s7")  # as if another process took s7 over

        second = [AppendMessage(1, UserMessage(text="y", turn_id="t"))]
        taken = [AppendMessage(0, UserMessage(text="again", turn_id="t"))]

        works = [taken if i == 3 else second for i in range(30)]
        outcomes = await asyncio.gather(
            *(s.commit(w) for s, w in zip(sessions, works, strict=True)),
            return_exceptions=True,
        )
        assert isinstance(outcomes[3], turnkit.StoreError)
        assert isinstance(outcomes[7], turnkit.SessionBusyError)
        assert [o for i, o in enumerate(outcomes) if i not in (3, 7)] == [None] * 28
        lengths = [len(await transcript(s)) for s in sessions]
        assert lengths == [1 if i in (3, 7) else 2 for i in range(30)]
        assert store.largest_commit_group > 2  # commits did go out in groups
    finally:
        await store.close()


async def test_a_commit_larger_than_the_socket_buffer_is_sent_whole(store: PostgresStore) -> None:
    """A request that does not fit the socket's buffer at once is flushed as the
    socket drains, on a new and on a prepared statement."""
    session = store.session("s1")
    big = "x" * 4_000_000
    for index in (0, 1):
        await session.commit([AppendMessage(index, UserMessage(text=f"{index}{big}", turn_id="t"))])
    assert [m.text[:2] for m in await transcript(session)] == ["0x", "1x"]
    assert [len(m.text) for m in await transcript(session)] == [len(big) + 1] * 2


async def test_the_counting_proxy_counts_each_transaction_that_ends(pg_dsn: str) -> None:
    """The proxy the round-trip figures come from (tests and ``benchmarks/scale_out.py``)
    counts a transaction for each statement run on its own and one for each
    BEGIN ... COMMIT, whatever the statements in between, and every statement the
    server completes."""
    proxy, proxied = await counting_proxy(pg_dsn)
    try:
        async with await psycopg.AsyncConnection.connect(proxied, autocommit=True) as conn:
            before, statements = proxy.transactions, proxy.statements
            for _ in range(3):
                await conn.execute("SELECT 1")
            async with conn.transaction():
                await conn.execute("SELECT 1")
                await conn.execute("SELECT 2")
            assert proxy.transactions - before == 4
            assert proxy.statements - statements == 7  # BEGIN and COMMIT count
    finally:
        await proxy.close()


async def test_a_group_of_commits_that_move_turns_goes_out_as_a_few_statements(
    pg_dsn: str, pg_schema: str
) -> None:
    """Commits of many sessions that queue behind a busy sender go out together with
    one statement for all their writer fences and one INSERT per table for all their
    rows, each turn's move carrying its session's row in the same statement: counted
    through a proxy, fewer than two statements a commit (32 for 30; one at a time,
    each was three: its rows, its turn's move and its session's row, besides its
    fence where it has one). Every commit still lands."""
    proxy, proxied = await counting_proxy(pg_dsn)
    store = PostgresStore(proxied, schema=pg_schema, commit_senders=1, relay_events=False)
    await store.open()
    try:
        sessions = [store.session(f"s{i}") for i in range(30)]
        said = UserMessage(text="x", turn_id="t")
        running = [
            TurnRecord(
                session_id=s.session_id, turn_id="t", agent="a", status="running", opening=said
            )
            for s in sessions
        ]
        await asyncio.gather(
            *(
                s.commit([AppendMessage(0, said), turn_rules.new_turn(r)])
                for s, r in zip(sessions, running, strict=True)
            )
        )
        answer = AssistantMessage(text="done", turn_id="t")
        before = proxy.statements
        await asyncio.gather(
            *(
                s.commit([AppendMessage(1, answer), turn_rules.move(r, "completed", text="done")])
                for s, r in zip(sessions, running, strict=True)
            )
        )
        sent = proxy.statements - before
        assert sent < 2 * len(sessions), sent
        for s in sessions:
            assert len(await transcript(s)) == 2
            turn = await s.turn("t")
            assert turn is not None and turn.status == "completed"
            assert await s.status() == "idle"
    finally:
        await store.close()
        await proxy.close()


@pytest.mark.parametrize(
    ("tool_kind", "per_pair"),
    [("async", 2), ("def", 2), ("def-writing", 3)],
    ids=["async-tool", "def-tool", "def-tool-writing"],
)
async def test_each_step_commit_is_one_round_trip(
    pg_dsn: str, pg_schema: str, tool_kind: str, per_pair: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's writes, its writer fence included, reach the server as one request:
    through a proxy that counts round trips, every model+tool pair a turn adds costs
    exactly two (one per step commit), for an async tool and for a local ``def``
    tool that leaves ``ctx.store`` alone; a ``def`` tool that writes a row through
    ``ctx.store.execute`` adds one (its statement, sent with the step's BEGIN). A
    turn's own cost besides is fixed."""
    # A delivery also re-reads its turn's cancellation once a second (for a lost
    # announcement): on a loaded machine a turn may last long enough for one, which
    # is a read, not a commit. Counted here are commits only (and the relay is off).
    monkeypatch.setattr(pg_store_module, "CANCEL_POLL", 3600.0)
    proxy, proxied = await counting_proxy(pg_dsn)

    async def noop_async() -> str:
        """Do nothing."""
        return "ok"

    def noop() -> str:
        """Do nothing."""
        return "ok"

    def write(ctx: ToolContext) -> str:
        """Write a row in the step's transaction."""
        ctx.store.execute("INSERT INTO app_rows (v) VALUES (?)", ["x"])
        return "ok"

    t = tool({"async": noop_async, "def": noop, "def-writing": write}[tool_kind])

    def respond(messages: Any) -> Any:
        done = sum(isinstance(m, turnkit.ToolMessage) for m in messages)
        return (
            ScriptedReply(tool_calls=[tool_call(t.name)]) if done < int(messages[0].text) else "end"
        )

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[t])
    trips: dict[int, int] = {}
    try:
        # The event relay publishes live events in batches a loaded machine cuts
        # differently each run: its own traffic, on its own connection, not commits.
        store = PostgresStore(proxied, schema=pg_schema, relay_events=False)
        async with turnkit.Runtime(agent, store=store) as runtime:
            with connect(pg_dsn) as conn:  # the schema exists once the store opened
                conn.execute(f'CREATE TABLE "{pg_schema}".app_rows (v text)')
            for pairs in (1, 2, 6):  # the first turn also opens the pool's connections
                session = runtime.session("a", f"s{pairs}")
                before = proxy.count
                result = await session.result(session.start(str(pairs)))
                assert result.status == "completed"
                trips[pairs] = proxy.count - before
    finally:
        await proxy.close()
    # Besides its pairs, a turn costs five: on the lock connection the writer lock
    # taken with the load and its release, the opening and the answer's commits, and
    # one on the store's own connection; no read of the turn's cancellation (the
    # load answered it: six before).
    assert (trips[2], trips[6]) == (per_pair * 2 + 5, per_pair * 6 + 5), trips


async def test_a_submitting_node_reads_a_sessions_agent_once_not_at_every_submission(
    pg_dsn: str, pg_schema: str
) -> None:
    """A submission reads whether the session has a parked turn and stores the new
    one: two round trips. Whose session it is (a session's agent never changes) is
    read until a read here has found it this agent's: at the first submission (no
    session yet) and the second; three round trips before, at every one."""
    proxy, proxied = await counting_proxy(pg_dsn)
    trips: list[int] = []
    try:
        store = PostgresStore(proxied, schema=pg_schema, relay_events=False)
        agent = turnkit.Agent(name="a", model=ScriptedModel([]))
        async with turnkit.RuntimeClient(agent, store=store) as client:
            await client.session("a", "warm").submit("opens the pool's connections")
            for n in range(4):
                before = proxy.count
                await client.session("a", "s1").submit(f"turn {n}")
                trips.append(proxy.count - before)
            mine = await store.session("s1").unfinished()
    finally:
        await proxy.close()
    assert trips == [3, 3, 2, 2], trips
    assert [r.opening.text for r in mine] == ["turn 0", "turn 1", "turn 2", "turn 3"]


async def test_text_the_server_cannot_hold_fails_the_commit_cleanly(store: PostgresStore) -> None:
    session = store.session("s1")

    nul = [
        AppendMessage(0, UserMessage(text="x", turn_id="t")),
        RequestCancel("t", "a reason with a \x00 in it"),
    ]

    with pytest.raises(turnkit.StoreError, match="NUL"):
        await session.commit(nul)

    surrogate = [
        AppendMessage(0, UserMessage(text="x", turn_id="t")),
        RequestCancel("t", "half a pair: \ud800"),
    ]

    with pytest.raises(turnkit.StoreError, match="not valid Unicode"):
        await session.commit(surrogate)
    assert await transcript(session) == []


# -- one writer per session across processes -------------------------------------------


async def test_a_second_process_waits_for_the_session_and_never_interleaves(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), pg_dsn, pg_schema, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def holding() -> bool:
            assert child.poll() is None, child.communicate()
            return (tmp_path / "holding").exists()

        await eventually(holding, what="the child in its tool")
        # The child is mid-turn: its tool call is out, the result not yet committed.
        store = PostgresStore(pg_dsn, schema=pg_schema, busy_timeout=0.3)
        agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: "parent"))
        async with turnkit.Runtime(agent, store=store) as rt:
            session = rt.session("a", "s1")
            with pytest.raises(turnkit.SessionBusyError, match="another process"):
                await session.result(session.start("too early"))
            before = await session.messages()
            assert [m.role for m in before] == ["user", "assistant"]  # nothing of ours
            # Now wait instead of refusing: release the child while we queue.
            store.busy_timeout = 60.0
            tid = session.start("parent")
            # A window for the parent to meet the held session at least once; released
            # earlier, it would not wait, and the asserts would still hold.
            await asyncio.sleep(0.2)  # not a wait: the window above
            (tmp_path / "release").touch()
            assert (await session.result(tid)).text == "parent"
            roles = [(m.role, m.turn_id == tid) for m in await session.messages()]
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.strip() == "child done"
        # The child's turn is whole and comes first; ours follows it.
        assert roles == [
            ("user", False),
            ("assistant", False),
            ("tool", False),
            ("assistant", False),
            ("user", True),
            ("assistant", True),
        ]
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


async def test_a_writer_that_lost_its_lock_is_fenced_off(pg_dsn: str, pg_schema: str) -> None:
    """Process A's lock connection dies mid-turn; B takes the session over; A's next
    commit must fail without writing, and B's turn stays whole."""
    gate = asyncio.Event()
    reached = asyncio.Event()

    @tool
    async def wait_gate() -> str:
        """Blocks until the test opens the gate."""
        reached.set()
        await gate.wait()
        return "open"

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.text == "a":
            return ScriptedReply(tool_calls=[tool_call("wait_gate")])
        return "answer"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[wait_gate])
    store_a = PostgresStore(pg_dsn, schema=pg_schema)
    store_b = PostgresStore(pg_dsn, schema=pg_schema, busy_timeout=10)
    async with (
        turnkit.Runtime(agent, store=store_a) as rt_a,
        turnkit.Runtime(agent, store=store_b) as rt_b,
    ):
        session_a = rt_a.session("a", "s1")
        tid_a = session_a.start("a")
        await reached.wait()
        pid = store_a.faults.lock_backend_pid()
        assert pid is not None
        with connect(pg_dsn) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # B can now take the lock: it finishes A's turn first (its call again), then
        # runs its own; the gate opens once B is inside A's call.
        reached.clear()
        b_turn = asyncio.create_task(rt_b.session("a", "s1").turn("b"))
        await asyncio.wait_for(reached.wait(), 30)
        gate.set()
        assert await asyncio.wait_for(b_turn, 30) == "answer"
        with pytest.raises(turnkit.FencedError, match="took the session over"):
            await session_a.result(tid_a)
        messages = await rt_b.session("a", "s1").messages()
        finished = await rt_b.session("a", "s1").result(tid_a)
    # A's own tool result never landed: B's did, A's turn ended whole, then B's ran.
    assert [(m.role, m.turn_id == tid_a) for m in messages] == [
        ("user", True),
        ("assistant", True),
        ("tool", True),
        ("assistant", True),
        ("user", False),
        ("assistant", False),
    ]
    assert isinstance(messages[2], turnkit.ToolMessage) and messages[2].result == "open"
    assert (finished.status, finished.text) == ("completed", "answer")


# -- connection loss ----------------------------------------------------------------


async def test_a_connection_killed_inside_a_step_fails_it_cleanly_and_a_redelivery_completes(
    store: PostgresStore,
) -> None:
    kills = iter([True])

    def order(ctx: ToolContext) -> str:
        """Writes an app row; the first time, its connection is killed mid-step."""
        ctx.store.execute("CREATE TABLE IF NOT EXISTS orders (turn_id text, call_id text)")
        ctx.store.execute("INSERT INTO orders VALUES (?, ?)", (ctx.turn_id, ctx.call_id))
        if next(kills, False):
            ctx.store.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return "ordered"

    async with turnkit.Runtime(one_tool_agent(order), store=store) as rt:
        session = rt.session("a", "s1")
        tid = session.start("go")
        with pytest.raises(turnkit.StoreError, match="lost the database connection"):
            await session.result(tid)
        # Nothing of the tool step committed: the opening and the model step did.
        assert [m.role for m in await session.messages()] == ["user", "assistant"]
        session.start("go", turn_id=tid)
        assert (await session.result(tid)).text == "done"
        assert [m.role for m in await session.messages()] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
    with connect(store.dsn) as conn:
        rows = conn.execute(f'SELECT count(*) FROM "{store.schema}".orders').fetchone()
    assert rows == (1,)


async def test_connections_killed_between_steps_are_replaced_without_failing_the_turn(
    store: PostgresStore,
) -> None:
    gate = asyncio.Event()
    reached = asyncio.Event()

    @tool
    async def wait_gate() -> str:
        """Blocks until the test opens the gate."""
        reached.set()
        await gate.wait()
        return "open"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("wait_gate")])
        return "through"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[wait_gate])
    async with turnkit.Runtime(agent, store=store) as rt:
        session = rt.session("a", "s1")
        tid = session.start("go")
        await reached.wait()
        name = f"turnkit-{store.schema}"
        with connect(store.dsn) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            ).fetchone()
            assert killed is not None and killed[0] >= 1
            # Wait until the backends are gone (termination is asynchronous), so the
            # pool sees closed sockets rather than racing a dying server process.

            def gone() -> bool:
                query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                return admin.execute(query, (name,)).fetchone() == (0,)

            await eventually(gone, what="the terminated backends gone")
        gate.set()
        assert (await session.result(tid)).text == "through"
        assert [m.role for m in await session.messages()] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
