"""Tenants: every turn is stored with its tenant; claims on PostgreSQL are fair across
tenants and respect ``Concurrency(per_tenant=...)`` across every worker holding its
own connections (as separate processes do); a runtime that runs its own turns
respects the cap on every store."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from eventually import eventually
from worker_support import pg_node, pg_worker

import turnkit
from turnkit import ToolContext, UserMessage, tool
from turnkit.stores import MemoryStore, PostgresStore, SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


class Gate:
    """What the agent's tool reports to and waits on: how many calls run per tenant
    right now, the most ever seen, and the event that lets them finish."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.release = asyncio.Event()

    def agent(self) -> turnkit.Agent:
        @tool
        async def work(ctx: ToolContext, tenant: str) -> str:
            """Do the tenant's work (waits for the test to release it)."""
            self.running[tenant] += 1
            self.most[tenant] = max(self.most[tenant], self.running[tenant])
            try:
                await self.release.wait()
            finally:
                self.running[tenant] -= 1
            return "done"

        def reply(messages: list[turnkit.Message]) -> str | ScriptedReply:
            last = messages[-1]
            if isinstance(last, UserMessage):
                return ScriptedReply(tool_calls=[tool_call("work", {"tenant": last.text})])
            return "ok"

        return turnkit.Agent(
            name="t", model=ScriptedModel(respond=reply, record_calls=False), tools=[work]
        )


async def test_a_submitted_turn_is_stored_with_its_tenant_on_every_store(tmp_path: Path) -> None:
    agent = turnkit.Agent(name="t", model=ScriptedModel(respond=lambda m: "hi"))
    for store in (MemoryStore(), SqliteStore(tmp_path / "t.db")):
        async with turnkit.Runtime(agent, store=store) as rt:
            s = rt.session("t", "s1")
            tid = await s.submit("hello", tenant="acme")
            await s.result(tid)
            other = await s.submit("again")
            await s.result(other)
            first = await store.session("s1").turn(tid)
            second = await store.session("s1").turn(other)
            assert first is not None and first.tenant == "acme", store
            assert second is not None and second.tenant == "", store
    with pytest.raises(turnkit.ConfigurationError, match="tenant must be a str"):
        async with turnkit.Runtime(agent, store=MemoryStore()) as rt:
            await rt.session("t", "s2").submit("x", tenant=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_runtime_that_runs_its_own_turns_keeps_each_tenant_under_its_cap(
    kind: str, tmp_path: Path
) -> None:
    gate = Gate()
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "caps.db")
    caps = turnkit.Concurrency(per_tenant=2, tenants={"big": 3})
    async with turnkit.Runtime(gate.agent(), store=store, concurrency=caps) as rt:
        turns = []
        for i in range(6):
            s = rt.session("t", f"a{i}")
            turns.append((s, await s.submit("a", tenant="a")))
        for i in range(5):
            s = rt.session("t", f"big{i}")
            turns.append((s, await s.submit("big", tenant="big")))
        for i in range(2):
            s = rt.session("t", f"b{i}")
            turns.append((s, await s.submit("b", tenant="b")))

        async def full() -> bool:
            return gate.running == Counter({"a": 2, "big": 3, "b": 2})

        await eventually(full, what="every tenant at its cap")
        gate.release.set()
        for s, tid in turns:
            assert (await s.result(tid)).status == "completed"
    assert gate.most == Counter({"a": 2, "big": 3, "b": 2})


async def test_claims_are_fair_across_tenants_and_capped_across_workers(
    pg_dsn: str, pg_schema: str
) -> None:
    """Tenant A queues 12 sessions before B and C queue 2 each. Two workers, each on
    its own connections, 8 slots each, cap 3 per tenant: A never runs more than 3 at
    once, B and C run at once (not behind A's backlog), and a third claimer with the
    same caps finds nothing to take while every tenant is at its cap."""
    gate = Gate()
    agent = gate.agent()
    caps = turnkit.Concurrency(per_tenant=3)
    async with pg_node(pg_dsn, pg_schema, agent) as rt:
        turns = []
        for tenant, n in (("A", 12), ("B", 2), ("C", 2)):
            for i in range(n):
                s = rt.session("t", f"{tenant}{i}")
                turns.append((tenant, s, await s.submit(tenant, tenant=tenant)))
        async with (
            pg_worker(pg_dsn, pg_schema, agent, caps=caps) as w1,
            pg_worker(pg_dsn, pg_schema, agent, caps=caps) as w2,
        ):

            async def busy() -> bool:
                return gate.running == Counter({"A": 3, "B": 2, "C": 2})

            await eventually(busy, what="A at its cap, B and C running")
            third = PostgresStore(pg_dsn, schema=pg_schema)
            await third.open()
            try:
                assert await third.claim(["t"], limit=10, concurrency=caps) == []
                # Without the cap a claim would take A's queued turns.
                taken = await third.claim(["t"], limit=2)
                assert {r.session_id[0] for r in taken} == {"A"} and len(taken) == 2
                for r in taken:
                    third.unclaim(r.session_id)
            finally:
                await third.close()
            assert w1.running + w2.running == 7
            gate.release.set()
            for _, s, tid in turns:
                assert (await s.result(tid)).status == "completed"
    assert gate.most == Counter({"A": 3, "B": 2, "C": 2})


async def test_a_claim_goes_round_the_tenants_least_served_first(
    pg_dsn: str, pg_schema: str
) -> None:
    """The claim's order, read directly: A's 10 turns are older than B's and C's, yet
    a claim of 5 takes B's and C's oldest beside A's; then, with A running 2 and B
    and C 1 each, the next claim of 2 takes B's and C's second turns, not A's third."""
    agent = turnkit.Agent(name="t", model=ScriptedModel(respond=lambda m: "hi"))
    async with pg_node(pg_dsn, pg_schema, agent) as rt:
        for tenant, n in (("A", 10), ("B", 3), ("C", 3)):
            for i in range(n):
                await rt.session("t", f"{tenant}{i}").submit(tenant, tenant=tenant)
        claimer = PostgresStore(pg_dsn, schema=pg_schema)
        await claimer.open()
        try:
            first = await claimer.claim(["t"], limit=5)
            # Place = tenant's running + rank: A0 B0 C0 (1), then A1 B1 (2, oldest first).
            assert [r.session_id for r in first] == ["A0", "B0", "C0", "A1", "B1"]
            second = await claimer.claim(["t"], limit=3, skip=[r.session_id for r in first])
            # Now A and B run 2, C 1: C1 first, then A2 and B2.
            assert [r.session_id for r in second] == ["C1", "A2", "B2"]
        finally:
            await claimer.close()


async def test_a_turn_over_http_is_its_principals_tenants(tmp_path: Path) -> None:
    from server_support import serving
    from starlette.requests import Request

    from turnkit.server import Principal

    def by_tenant(request: Request) -> Principal | None:
        user = request.headers.get("X-User")
        return Principal(id=user, tenant=request.headers.get("X-Tenant")) if user else None

    agent = turnkit.Agent(name="t", model=ScriptedModel(respond=lambda m: "hi"))
    store = SqliteStore(tmp_path / "http.db")
    async with turnkit.Runtime(agent, store=store) as rt, serving(rt, authenticate=by_tenant) as s:
        for session, headers in (
            ("s1", {"X-User": "ann", "X-Tenant": "acme"}),
            ("s2", {"X-User": "bob"}),
        ):
            done = await s.client.post(
                s.path("t", session, "chat"), json={"text": "x"}, headers=headers
            )
            assert done.json()["status"] == "completed", done.text
    with sqlite3.connect(tmp_path / "http.db") as db:
        rows = db.execute("SELECT session_id, tenant FROM turnkit_turns ORDER BY 1").fetchall()
    assert rows == [("s1", "acme"), ("s2", "")]


async def test_export_and_import_keep_each_turns_tenant(tmp_path: Path) -> None:
    agent = turnkit.Agent(name="t", model=ScriptedModel(respond=lambda m: "hi"))
    source, target = SqliteStore(tmp_path / "a.db"), MemoryStore()
    async with turnkit.Runtime(agent, store=source) as rt:
        s = rt.session("t", "s1")
        first = await s.submit("one", tenant="acme")
        await s.result(first)
        second = await s.submit("two")
        await s.result(second)
        exported = await turnkit.export_session(source, "s1")
    async with turnkit.Runtime(agent, store=target):
        await turnkit.import_session(target, exported)
        one, two = await target.session("s1").turn(first), await target.session("s1").turn(second)
    assert one is not None and one.tenant == "acme"
    assert two is not None and two.tenant == ""


async def claim_parameters(
    dsn: str, schema: str, *, caps: tuple[str, int | None], sweep: bool
) -> tuple[object, ...]:
    """The claim's parameters for agent ``t``, four sessions at most, with ``caps``
    (per tenant as JSON, and the default) and ``sweep`` (whether held turns are looked
    at), after creating the schema's tables."""
    store = PostgresStore(dsn, schema=schema)
    await store.open()
    await store.close()
    agents, skip = '["t"]', "[]"
    return (
        *caps,
        *(agents, skip, None, None, 4),  # runnable turns
        4,  # free slots
        *(agents, skip, 4),  # pending resets
        *(sweep, '{"t": "v1"}', agents, skip, None, None, 4),  # held turns
        4,
    )


async def test_the_claim_as_planned_gives_back_a_slot_whose_session_it_cannot_lock(
    pg_dsn: str, pg_schema: str
) -> None:
    """A claim that takes a tenant's slot and then finds the session locked by another
    claim (which read the locks a moment before it) must give the slot back, or the
    tenant runs under its cap until the worker stops. The give-back is a call inside
    the claim's filter, and the planner drops calls whose result cannot change the
    filter's value (``unlock(...) AND false`` became ``false``): the plan PostgreSQL
    makes of the statement still calls it."""
    from turnkit.stores.postgres._queue import CLAIM_SQL
    from turnkit.stores.postgres._statements import pg

    params = await claim_parameters(pg_dsn, pg_schema, caps=('{"A": 1}', 2), sweep=True)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute("EXPLAIN (VERBOSE, COSTS OFF) " + pg(CLAIM_SQL, pg_schema), params)
        plan = "\n".join(str(r[0]) for r in rows)
    assert "pg_advisory_unlock(p.key, p.slot)" in plan, plan


async def test_a_slot_handed_to_a_delivery_cancelled_meanwhile_passes_to_the_next() -> None:
    """The slot given back goes to the first waiter; if that waiter is cancelled before
    it resumes, the slot passes on instead of being lost, and an excused waiter runs
    without one."""
    from turnkit._runtime.tenant_slots import TenantSlots, excuse

    loop = asyncio.get_running_loop()
    slots = TenantSlots(1)
    first, second, third, fourth = (loop.create_future() for _ in range(4))
    assert await slots.take(first)
    cancelled = asyncio.ensure_future(slots.take(second))
    after = asyncio.ensure_future(slots.take(third))
    excused = asyncio.ensure_future(slots.take(fourth))
    await eventually(lambda: len(slots._waiting) == 3, what="three waiters")
    excuse(fourth)
    assert await excused is False
    slots.give_back()  # to ``second``, which is cancelled before it resumes
    cancelled.cancel()
    assert await asyncio.wait_for(after, 30) is True
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    slots.give_back()
    assert await asyncio.wait_for(slots.take(loop.create_future()), 30) is True


async def test_the_claim_reads_turns_and_sessions_by_key_on_a_plan_made_when_they_were_few(
    pg_dsn: str, pg_schema: str
) -> None:
    """A worker's claim is a prepared statement, and PostgreSQL keeps its generic plan
    until the tables are next analyzed. Planned while ``turnkit_turns`` was nearly
    empty (a new schema, the first seconds of a run), the claim joined its candidates
    to the turns and sessions by reading and sorting both tables whole, every claim:
    20 ms a claim at 4,000 turns, and growing with the table. The plan made on the
    empty tables must look the rows up by key, so a claim's cost does not grow with
    the turns and sessions the store keeps. And with the lock connection's settings
    that plan is the one every claim runs: none is planned anew (a custom plan each
    time cost the server ~2 ms a claim, six times the run itself)."""
    from turnkit.stores.postgres._queue import CLAIM_SQL
    from turnkit.stores.postgres._statements import pg_wire
    from turnkit.stores.postgres._writer import LOCK_SESSION

    params = await claim_parameters(pg_dsn, pg_schema, caps=("{}", None), sweep=False)
    marks = ", ".join(["%s"] * len(params))
    # (values bound in the client: the $n of the statement prepared are its own)
    with psycopg.connect(pg_dsn, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        for setting in LOCK_SESSION:
            conn.execute(setting)
        conn.execute(b"PREPARE claim AS " + pg_wire(CLAIM_SQL, pg_schema))
        conn.execute(f"EXECUTE claim({marks})", params)  # the plan, made on empty tables
        conn.execute(
            f'INSERT INTO "{pg_schema}".turnkit_sessions '
            "(session_id, agent, status, created_at, updated_at) "
            "SELECT 's' || n, 't', 'idle', n, n FROM generate_series(1, 3000) n"
        )
        conn.execute(
            f'INSERT INTO "{pg_schema}".turnkit_turns '
            "(session_id, turn_id, agent, status, opening, created_at, finished_at) "
            "SELECT 's' || (n % 3000 + 1), 't' || n, 't', 'completed', '{}', n, n "
            "FROM generate_series(1, 6000) n"
        )
        rows = conn.execute(f"EXPLAIN (VERBOSE, COSTS OFF) EXECUTE claim({marks})", params)
        plan = "\n".join(str(r[0]) for r in rows)
        for _ in range(6):
            conn.execute(f"EXECUTE claim({marks})", params)
            conn.execute("SELECT pg_advisory_unlock_all()")
        planned = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'claim'"
        ).fetchone()
    for table in ("turnkit_turns", "turnkit_sessions"):
        assert f"Seq Scan on {pg_schema}.{table}" not in plan, plan
    assert planned is not None and planned[1] == 0 and planned[0] >= 7, planned
