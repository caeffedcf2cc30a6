"""PostgresStore as a deployment meets it: the least privileges docs/stores.md
documents (run as exactly such roles), the user's connection settings kept, and a
refused resume that writes nothing at all.

Everything here talks to the real server named by ``TURNKIT_TEST_POSTGRES_DSN``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from suite_paths import ROOT

import turnkit
from turnkit import (
    Answerers,
    InboundEvent,
    ResumeAuthorizationError,
    ResumeConflictError,
    ToolContext,
    ToolMessage,
    User,
    UserMessage,
    tool,
)
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

psycopg = pytest.importorskip("psycopg", reason="PostgreSQL tests need turnkit[postgres]")

from psycopg import conninfo  # noqa: E402

from turnkit.stores import PostgresStore  # noqa: E402

STORES_DOC = ROOT / "docs" / "stores.md"


def admin(dsn: str) -> Any:
    return psycopg.connect(dsn, autocommit=True)


def snapshot(dsn: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table in ``schema``, in a stable order."""
    with admin(dsn) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
            )
        ]
        return {
            t: sorted(conn.execute(f'SELECT * FROM "{schema}"."{t}"').fetchall(), key=repr)
            for t in tables
        }


def privileges_sql() -> str:
    """The SQL block under "Least privileges" in docs/stores.md."""
    section = STORES_DOC.read_text().split("### Least privileges", 1)[1]
    found = re.search(r"```sql\n(.*?)```", section, re.S)
    assert found is not None, "docs/stores.md: no ```sql block under Least privileges"
    return found.group(1)


@pytest.fixture
def roles(pg_dsn: str, pg_schema: str) -> Iterator[tuple[str, str]]:
    """The documented owner and service roles, made by running the docs' SQL (with
    this test's schema and unique role names), dropped with what they own after."""
    suffix = uuid.uuid4().hex[:8]
    owner, app = f"turnkit_owner_{suffix}", f"turnkit_app_{suffix}"
    sql = privileges_sql()
    sql = re.sub(r"\bturnkit_owner\b", owner, sql)
    sql = re.sub(r"\bturnkit_app\b", app, sql)
    sql = re.sub(r"\bturnkit\b", f'"{pg_schema}"', sql)
    with admin(pg_dsn) as conn:
        for statement in (s.strip() for s in sql.split(";")):
            lines = [ln for ln in statement.splitlines() if not ln.strip().startswith("--")]
            if "".join(lines).strip():
                conn.execute("\n".join(lines))
    try:
        yield owner, app
    finally:
        with admin(pg_dsn) as conn:
            for role in (app, owner):
                conn.execute(f"DROP OWNED BY {role} CASCADE")
                conn.execute(f"DROP ROLE {role}")


def as_role(dsn: str, role: str) -> str:
    return conninfo.make_conninfo(dsn, user=role)


def has_create(dsn: str, role: str, schema: str) -> tuple[bool, bool]:
    with admin(dsn) as conn:
        row = conn.execute(
            "SELECT has_database_privilege(%s, current_database(), 'CREATE'), "
            "has_schema_privilege(%s, %s, 'CREATE')",
            (role, role, schema),
        ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def refund_agent() -> turnkit.Agent:
    @tool
    async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order once U1 approves."""
        answer = await ctx.request_input(
            "approve",
            f"Refund {order_id}?",
            schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
            answerers=Answerers.user("U1"),
        )
        return {"refunded": bool(answer.get("ok"))}

    @tool
    def note(text: str, ctx: ToolContext) -> str:
        """Counts the session's turns through ctx.store (a local tool's SQL)."""
        rows = ctx.store.execute("SELECT count(*) FROM turnkit_turns WHERE agent = ?", ("a",))
        return f"{text}: {rows[0][0]} turns"

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.text.startswith("refund"):
            return ScriptedReply(tool_calls=[tool_call("refund", {"order_id": last.text})])
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("note", {"text": last.text})])
        if isinstance(last, ToolMessage):
            return f"done: {last.result}"
        return "?"

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[refund, note])


def attested() -> InboundEvent:
    return InboundEvent(source="slack", text="refund", user=User(id="U1", attested=True))


# -- least privileges --------------------------------------------------------------------


async def test_the_documented_least_privileges_are_enough(
    pg_dsn: str, pg_schema: str, roles: tuple[str, str]
) -> None:
    """The owner, with no CREATE on the database, migrates the schema it owns; the
    service role, with no CREATE anywhere, then runs turns, a local tool's SQL, a
    park and its resume, and a reset."""
    owner, app = roles
    assert has_create(pg_dsn, owner, pg_schema) == (False, True)
    owning = PostgresStore(as_role(pg_dsn, owner), schema=pg_schema)
    await owning.open()
    await owning.close()
    assert has_create(pg_dsn, app, pg_schema) == (False, False)
    store = PostgresStore(as_role(pg_dsn, app), schema=pg_schema)
    async with turnkit.Runtime(refund_agent(), store=store) as rt:
        session = rt.session("a", "s1")
        assert await session.turn("hello") == "done: hello: 1 turns"
        parked = await session.result(session.start("refund o-1", event=attested()))
        assert parked.status == "suspended"
        resumed = await session.resume(parked.turn_id, "approve", {"ok": True}, by="U1")
        assert (await session.result(resumed)).text == "done: {'refunded': True}"
        assert (await session.reset()).archived_generation == 0
        assert await session.turn("again") == "done: again: 1 turns"
        assert await session.generations() == [0]


async def test_an_existing_schema_is_opened_without_create_on_the_database(
    pg_dsn: str, pg_schema: str, roles: tuple[str, str]
) -> None:
    owner, _ = roles
    with admin(pg_dsn) as conn:  # the owner may not create schemas in this database
        conn.execute(f"REVOKE CREATE ON DATABASE {conn.info.dbname} FROM {owner}")
    store = PostgresStore(as_role(pg_dsn, owner), schema=pg_schema)
    await store.open()
    try:
        assert store.store_id
    finally:
        await store.close()


# -- the user's connection settings ----------------------------------------------------


async def test_the_dsn_options_and_application_name_are_kept(pg_dsn: str, pg_schema: str) -> None:
    dsn = conninfo.make_conninfo(
        pg_dsn,
        options="-c lock_timeout=300 -c statement_timeout=777",
        application_name="billing-worker",
    )
    seen: list[tuple[Any, ...]] = []

    def settings(ctx: ToolContext) -> str:
        """Reads the session settings of the step's connection."""
        (row,) = ctx.store.execute(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), "
            "current_setting('application_name'), current_schema()"
        )
        seen.append(tuple(row))
        return "ok"

    t = tool(settings)

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call(t.name)])
        return "done"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[t])
    store = PostgresStore(dsn, schema=pg_schema)
    async with turnkit.Runtime(agent, store=store) as rt:
        assert await rt.session("a", "s1").turn("go") == "done"
        async with store.async_pool.connection() as conn:
            cur = await conn.execute(
                "SELECT current_setting('lock_timeout'), current_setting('application_name')"
            )
            assert await cur.fetchone() == ("300ms", "billing-worker")
    assert seen == [("300ms", "777ms", "billing-worker", pg_schema)]


# -- a refused resume writes nothing -----------------------------------------------------


async def test_a_refused_resume_writes_nothing_at_all(pg_dsn: str, pg_schema: str) -> None:
    """Wrong turn, wrong input, a value the schema refuses, a user who may not
    answer: each is refused and leaves every table, the writer table included,
    exactly as it was; then the right answer goes through."""
    store = PostgresStore(pg_dsn, schema=pg_schema)
    async with turnkit.Runtime(refund_agent(), store=store) as rt:
        session = rt.session("a", "s1")
        parked = await session.result(session.start("refund o-1", event=attested()))
        assert parked.status == "suspended"
        before = snapshot(pg_dsn, pg_schema)
        refusals: list[tuple[type[Exception], str, str, Any, str | None]] = [
            (ResumeConflictError, "not-the-turn", "approve", {"ok": True}, "U1"),
            (ResumeConflictError, parked.turn_id, "not-the-input", {"ok": True}, "U1"),
            (turnkit.InvalidAnswerError, parked.turn_id, "approve", {"ok": "yes"}, "U1"),
            (ResumeAuthorizationError, parked.turn_id, "approve", {"ok": True}, "U2"),
        ]
        for error, turn_id, input_id, value, by in refusals:
            with pytest.raises(error):
                await session.resume(turn_id, input_id, value, by=by)
            assert snapshot(pg_dsn, pg_schema) == before, error
        resumed = await session.resume(parked.turn_id, "approve", {"ok": True}, by="U1")
        assert (await session.result(resumed)).status == "completed"


# -- the store's own statements name their schema -----------------------------------------


def test_shared_statements_are_rendered_for_the_stores_schema() -> None:
    from turnkit.stores.postgres._statements import pg

    rendered = pg("SELECT body FROM turnkit_messages m WHERE m.session_id = ? AND x = '?'", "s1")
    assert rendered == (
        "SELECT body FROM \"s1\".turnkit_messages m WHERE m.session_id = %s AND x = '?'"
    )
    assert pg("SELECT turnkit_fence(?, ?)", "app") == 'SELECT "app".turnkit_fence(%s, %s)'


async def test_a_tool_that_moves_search_path_cannot_redirect_the_steps_rows(
    pg_dsn: str, pg_schema: str
) -> None:
    """The step's own rows name the store's schema, so a local tool that points
    ``search_path`` elsewhere inside the step's transaction changes only its own
    statements."""
    elsewhere = f"{pg_schema}_elsewhere"

    def wander(ctx: ToolContext) -> str:
        """Moves search_path to an empty schema, then writes a row there."""
        ctx.store.execute(f'SET LOCAL search_path TO "{elsewhere}"')
        ctx.store.execute("CREATE TABLE notes (text text)")
        ctx.store.execute("INSERT INTO notes VALUES (?)", ("hi",))
        return "wandered"

    t = tool(wander)

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call(t.name)])
        return "done"

    with admin(pg_dsn) as conn:
        conn.execute(f'CREATE SCHEMA "{elsewhere}"')
    try:
        agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[t])
        async with turnkit.Runtime(agent, store=PostgresStore(pg_dsn, schema=pg_schema)) as rt:
            session = rt.session("a", "s1")
            assert await session.turn("go") == "done"
            assert [m.role for m in await session.messages()] == [
                "user",
                "assistant",
                "tool",
                "assistant",
            ]
        with admin(pg_dsn) as conn:
            assert conn.execute(f'SELECT text FROM "{elsewhere}".notes').fetchall() == [("hi",)]
    finally:
        with admin(pg_dsn) as conn:
            conn.execute(f'DROP SCHEMA "{elsewhere}" CASCADE')
