"""Cells: one deployment over two PostgreSQL databases of the test server. Tenants are
placed by a stable hash or by the app's function and stay where they were first
placed; one runtime's workers run the turns of both cells; the lists an operator
reads cover both."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta

import pytest
from cells_support import CellPlaces, by_region, places, second_database
from eventually import eventually
from worker_support import running

import turnkit
from turnkit import (
    Budget,
    Limit,
    Price,
    StoreError,
    ToolContext,
    ToolMessage,
    Usage,
    UserMessage,
    tool,
)
from turnkit.stores.postgres import Cells, move_tenant, stable_hash
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

__all__ = ["places", "second_database"]  # the fixtures, used by name


def echo() -> turnkit.Agent:
    return turnkit.Agent(
        name="echo",
        model=ScriptedModel(respond=lambda m: f"re: {m[-1].text}", record_calls=False),  # type: ignore[union-attr]
    )


@asynccontextmanager
async def workers(
    places: CellPlaces,
    agent: turnkit.Agent,
    n: int,
    budget: turnkit.Budget | None = None,
    **options: object,
) -> AsyncIterator[None]:
    """``n`` workers, each in a runtime of its own over both cells."""
    async with AsyncExitStack() as stack:
        for _ in range(n):
            store = places.cells(by_region, relay_events=False, **options)
            rt = await stack.enter_async_context(turnkit.Runtime(agent, store=store, budget=budget))
            await stack.enter_async_context(running(turnkit.Worker(rt, poll=0.2, concurrency=4)))
        yield


def test_the_default_placement_is_a_stable_hash_that_a_new_cell_disturbs_little() -> None:
    two = stable_hash(["a", "b"])
    tenants = [f"tenant-{n}" for n in range(400)]
    placed = {t: two(t) for t in tenants}
    assert placed == {t: stable_hash(["b", "a"])(t) for t in tenants}  # order-free
    counts = {cell: list(placed.values()).count(cell) for cell in "ab"}
    assert min(counts.values()) > 150, counts  # both cells get a fair share
    three = stable_hash(["a", "b", "c"])
    moved = [t for t in tenants if three(t) != placed[t]]
    assert all(three(t) == "c" for t in moved)  # a new cell only takes, never reshuffles
    assert 80 < len(moved) < 200, len(moved)


async def test_sessions_go_to_their_tenants_cell_and_stay_where_it_was_pinned(
    places: CellPlaces,
) -> None:
    async with turnkit.RuntimeClient(echo(), store=places.cells(by_region)) as rt:
        for tenant, session in (("eu-1", "s-eu"), ("us-1", "s-us"), ("", "s-default")):
            await rt.session("echo", session).submit("hi", tenant=tenant)
    assert places.rows("a", "SELECT session_id FROM turnkit_sessions ORDER BY 1") == [
        ("s-default",),
        ("s-us",),
    ]
    assert places.rows("b", "SELECT session_id, tenant FROM turnkit_turns") == [("s-eu", "eu-1")]
    # Another deployment's placement would put eu-1 in a: its tenant is pinned to b.
    everything_in_a = places.cells(lambda tenant: "a")
    async with turnkit.RuntimeClient(echo(), store=everything_in_a) as rt:
        await rt.session("echo", "s-eu-2").submit("again", tenant="eu-1")
        await rt.session("echo", "s-new").submit("new", tenant="eu-2")
        assert (await rt.store.session("s-eu").unfinished())[0].tenant == "eu-1"
    assert places.rows("b", "SELECT session_id FROM turnkit_sessions ORDER BY 1") == [
        ("s-eu",),
        ("s-eu-2",),
    ]
    assert ("s-new",) in places.rows("a", "SELECT session_id FROM turnkit_sessions")


async def test_a_placement_naming_no_cell_is_refused_naming_it(places: CellPlaces) -> None:
    async with turnkit.RuntimeClient(echo(), store=places.cells(lambda t: "mars")) as rt:
        with pytest.raises(turnkit.ConfigurationError, match="'mars', which is not one of"):
            await rt.session("echo", "s1").submit("hi", tenant="acme")


async def test_one_set_of_workers_runs_the_turns_of_both_cells(places: CellPlaces) -> None:
    agent = echo()
    tenants = ["eu-a", "eu-b", "us-a", "us-b"]
    async with turnkit.RuntimeClient(agent, store=places.cells(by_region)) as node:
        turns = {}
        for n in range(12):
            tenant = tenants[n % 4]
            session = node.session("echo", f"{tenant}-{n}")
            turns[session] = await session.submit(f"n{n}", tenant=tenant)
        async with workers(places, agent, 2):
            for session, turn_id in turns.items():
                result = await asyncio.wait_for(session.result(turn_id), 30)
                assert result.status == "completed", result
                assert result.text == f"re: n{session.session_id.rsplit('-', 1)[1]}"
        store = node.store
        assert isinstance(store, Cells)
        listed = await turnkit.stores.all_sessions(store)
        assert sorted(i.session_id for i in listed) == sorted(s.session_id for s in turns)
        assert await store.turn_counts() == {"queued": 0, "running": 0, "suspended": 0}
    done = "SELECT count(*) FROM turnkit_turns WHERE status = 'completed'"
    assert places.rows("a", done) == [(6,)] and places.rows("b", done) == [(6,)]


async def test_a_runtime_that_runs_its_own_turns_places_them_too(places: CellPlaces) -> None:
    async with turnkit.Runtime(echo(), store=places.cells(by_region)) as rt:
        assert await rt.session("echo", "x").turn("hello", tenant="eu-9") == "re: hello"
        assert await rt.session("echo", "y").turn("hello", tenant="us-9") == "re: hello"
    assert places.rows("b", "SELECT session_id, status FROM turnkit_turns") == [("x", "completed")]
    assert places.rows("a", "SELECT session_id, status FROM turnkit_turns") == [("y", "completed")]


async def test_a_database_that_becomes_the_home_cell_keeps_its_sessions(
    places: CellPlaces,
) -> None:
    async with turnkit.Runtime(echo(), store=places.store("a")) as rt:
        await rt.session("echo", "old").turn("before cells", tenant="eu-1")
    cells = places.cells(by_region)
    async with turnkit.Runtime(echo(), store=cells) as rt:
        assert await rt.session("echo", "old").turn("after", tenant="eu-1") == "re: after"
        assert await cells.directory.cell_of("old") == "a"
    assert places.rows("b", "SELECT count(*) FROM turnkit_turns") == [(0,)]


# -- moving a tenant ----------------------------------------------------------------

LONG = "a long reply that the store keeps as a blob. " * 20
PRICES = {"m": Price(input_per_million=1.0, output_per_million=2.0)}
BUDGET = Budget(per_tenant=Limit(tokens=10**9), prices=PRICES)
BLOBS: dict[str, object] = {"blobs": True, "blob_threshold": 256}


class Crash(Exception):
    """The process running a move dies here."""


def mover() -> turnkit.Agent:
    """Answers with a long text (kept as a blob), or asks a person first."""

    @tool
    async def ask(ctx: ToolContext, question: str) -> str:
        """Ask the person."""
        return str(await ctx.request_input("answer", question))

    def reply(messages: list[turnkit.Message]) -> ScriptedReply:
        last = messages[-1]
        used = Usage(input_tokens=100, output_tokens=10)
        if isinstance(last, UserMessage) and last.text.startswith("ask"):
            return ScriptedReply(tool_calls=[tool_call("ask", {"question": "which?"})], usage=used)
        if isinstance(last, ToolMessage):
            return ScriptedReply(text=f"you said {last.result}", usage=used)
        return ScriptedReply(text=f"{LONG}({last.text})", usage=used)

    model = ScriptedModel(respond=reply, record_calls=False)
    model.model = "m"  # type: ignore[attr-defined]  # the name the prices use
    return turnkit.Agent(name="m", model=model, tools=[ask])


async def dump(store: Cells, sid: str) -> tuple[object, ...]:
    """Everything the store API reads of a session."""
    session = store.session(sid)
    generations = await session.generations()
    return (
        (await session.load(from_index=0)).messages,
        [(t.turn_id, t.status, t.tenant, t.pending) for t in await session.unfinished()],
        await session.events(),
        generations,
        [await session.archived_messages(g) for g in generations],
        await session.spend("us-1"),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "dies_at", ["draining tenant", "copied session s2", "verified", "now lives in"]
)
async def test_a_tenant_moves_with_all_it_has_and_a_move_that_died_is_finished(
    places: CellPlaces, dies_at: str
) -> None:
    agent = mover()
    async with turnkit.Runtime(agent, store=places.cells(by_region, **BLOBS), budget=BUDGET) as rt:
        s1 = rt.session("m", "s1")
        await s1.turn("one", tenant="us-1")
        await s1.reset()
        await s1.turn("two", tenant="us-1")
        s2 = rt.session("m", "s2")
        parked = await s2.result(await s2.submit("ask me", tenant="us-1"))
        assert parked.status == "suspended" and parked.request is not None
        await rt.session("m", "elsewhere").turn("hi", tenant="eu-1")  # lives in b already
    cells = places.cells(by_region, **BLOBS)
    async with turnkit.RuntimeClient(agent, store=cells) as node:
        queued = await node.session("m", "s3").submit("three", tenant="us-1")
        before = {sid: await dump(cells, sid) for sid in ("s1", "s2", "s3")}
        usage = await cells.usage_by_tenant()
        blobs = "SELECT count(*) FROM turnkit_blobs"
        (in_a,), (in_b,) = places.rows("a", blobs)[0], places.rows("b", blobs)[0]
        assert in_a > 0 and in_b > 0

        said: list[str] = []

        def dying(line: str) -> None:
            said.append(line)
            if dies_at in line:
                raise Crash

        with pytest.raises(Crash):
            await move_tenant(cells, "us-1", "b", progress=dying)
        # Mid-move the tenant's new turns are refused, saying why; nothing is lost.
        with pytest.raises(StoreError, match=r"tenant 'us-1' (has moved|is arriving|is moving)"):
            await node.session("m", "s4").submit("refused", tenant="us-1")
        moved = await move_tenant(cells, "us-1", "b", progress=said.append)
        assert (moved.source, moved.target, moved.sessions) == ("a", "b", 4)  # s4 was placed
        assert said[-1] == "cleared 4 sessions from cell 'a'"

        assert {sid: await dump(cells, sid) for sid in ("s1", "s2", "s3")} == before
        assert await cells.usage_by_tenant() == usage
        gone = "SELECT count(*) FROM {} WHERE session_id IN ('s1', 's2', 's3')"
        for table in ("turnkit_sessions", "turnkit_turns", "turnkit_messages", "turnkit_blobs"):
            assert places.rows("a", gone.format(table)) == [(0,)], table
        assert places.rows("a", "SELECT count(*) FROM turnkit_usage WHERE tenant = 'us-1'") == [
            (0,)
        ]
        assert places.rows("b", blobs) == [(in_a + in_b,)]
        assert places.rows("b", "SELECT count(*) FROM turnkit_archived_messages") == [(2,)]

        # In its new cell the tenant's turns run on: the queued one, the answered one.
        async with workers(places, agent, 1, BUDGET, **BLOBS):
            done = await asyncio.wait_for(node.session("m", "s3").result(queued), 30)
            assert done.status == "completed" and done.text == f"{LONG}(three)"
            await node.session("m", "s2").resume(parked.turn_id, parked.request.id, "blue")
            answered = await asyncio.wait_for(node.session("m", "s2").result(parked.turn_id), 30)
            assert answered.text == "you said blue"
            await node.session("m", "s5").submit("new", tenant="us-1")
    assert places.rows("b", "SELECT tenant FROM turnkit_cell_fences") == []
    assert places.rows("a", "SELECT tenant, state, cell FROM turnkit_cell_fences") == [
        ("us-1", "frozen", "b")
    ]
    assert ("s5",) in places.rows("b", "SELECT session_id FROM turnkit_sessions")
    assert places.rows("a", "SELECT count(*) FROM turnkit_cell_moves") == [(0,)]


@pytest.mark.slow
async def test_a_move_waits_for_the_tenants_running_turns_and_holds_its_new_ones(
    places: CellPlaces,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def work(ctx: ToolContext) -> str:
        """Work until the test says so."""
        started.set()
        await release.wait()
        return "worked"

    def reply(messages: list[turnkit.Message]) -> ScriptedReply:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("work", {})])
        return ScriptedReply(text="finished")

    agent = turnkit.Agent(name="w", model=ScriptedModel(respond=reply), tools=[work])
    cells = places.cells(by_region)
    async with turnkit.Runtime(agent, store=cells) as rt:
        session = rt.session("w", "busy")
        running = await session.submit("go", tenant="us-2")
        await asyncio.wait_for(started.wait(), 30)
        with pytest.raises(StoreError, match=r"tenant 'us-2' still has turns running after 0.3 s"):
            await move_tenant(cells, "us-2", "b", drain_timeout=0.3)
        # The drain holds the tenant's new turns meanwhile (run the move again to go on).
        with pytest.raises(StoreError, match="tenant 'us-2' is moving to cell 'b'"):
            await rt.session("w", "new").submit("later", tenant="us-2")
        draining = asyncio.Event()
        moving = asyncio.ensure_future(
            move_tenant(cells, "us-2", "b", progress=lambda line: draining.set())
        )
        await asyncio.wait_for(draining.wait(), 30)
        assert not moving.done()
        stage = "SELECT stage FROM turnkit_cell_moves"
        assert places.rows("a", stage) == [("draining",)]
        with pytest.raises(StoreError, match="'us-2' is being moved by another process"):
            await move_tenant(cells, "us-2", "b")
        release.set()
        moved = await asyncio.wait_for(moving, 30)
        assert moved.sessions == 2  # "new" was placed before its turn was refused
        result = await session.result(running)
        assert result.status == "completed" and result.text == "finished"
        assert (await cells.session("busy").turn(running)).status == "completed"  # type: ignore[union-attr]
    assert places.rows("b", "SELECT session_id, status FROM turnkit_turns") == [
        ("busy", "completed")
    ]
    assert places.rows("a", "SELECT count(*) FROM turnkit_turns") == [(0,)]


def turnkit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``turnkit`` command in a process of its own, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
async def test_the_command_line_lists_every_cell_and_moves_a_tenant(places: CellPlaces) -> None:
    async with turnkit.Runtime(echo(), store=places.cells(by_region)) as rt:
        await rt.session("echo", "in-a").turn("hi", tenant="us-1")
        await rt.session("echo", "in-b").turn("hi", tenant="eu-1")
    spec = places.spec()
    listed = await asyncio.to_thread(turnkit_cli, "sessions", "--store", spec, "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(s["session_id"] for s in json.loads(listed.stdout)) == ["in-a", "in-b"]
    cells = await asyncio.to_thread(turnkit_cli, "cells", "list", "--store", spec, "--json")
    assert cells.returncode == 0, cells.stderr
    assert json.loads(cells.stdout)["tenants"] == {"eu-1": "b", "us-1": "a"}

    moved = await asyncio.to_thread(
        turnkit_cli, "cells", "move", "us-1", "--to", "b", "--store", spec
    )
    assert moved.returncode == 0, moved.stderr
    assert "copied session in-a" in moved.stdout
    assert moved.stdout.splitlines()[-1] == "moved tenant 'us-1' (1 sessions) to cell 'b'"
    cells = await asyncio.to_thread(turnkit_cli, "cells", "list", "--store", spec)
    assert cells.stdout.splitlines() == [
        "a (home): 0 sessions, 0 tenants",
        "b: 2 sessions, 2 tenants: 'eu-1', 'us-1'",
    ]
    listed = await asyncio.to_thread(turnkit_cli, "sessions", "--store", spec, "--json")
    assert sorted(s["session_id"] for s in json.loads(listed.stdout)) == ["in-a", "in-b"]
    wrong = await asyncio.to_thread(
        turnkit_cli, "cells", "move", "us-1", "--to", "c", "--store", spec
    )
    assert wrong.returncode == 2 and "no cell 'c': the cells are ['a', 'b']" in wrong.stderr
    one = await asyncio.to_thread(turnkit_cli, "cells", "list", "--store", places.dsn_a)
    assert one.returncode == 2 and "turnkit cells needs --store cells:" in one.stderr


async def test_a_claim_takes_a_share_from_each_cell(places: CellPlaces) -> None:
    cells = places.cells(by_region)
    async with turnkit.RuntimeClient(echo(), store=cells) as node:
        for n in range(10):
            await node.session("echo", f"us-{n}").submit("x", tenant=f"us-{n}")
        await node.session("echo", "eu-0").submit("x", tenant="eu-0")
        first = await cells.claim(["echo"], limit=4)
        # The busy cell gets no more than its share while the other has work.
        assert "eu-0" in {c.session_id for c in first} and len(first) == 4
        second = await cells.claim(["echo"], limit=4, skip=[c.session_id for c in first])
        assert len(second) == 4 and all(c.session_id.startswith("us-") for c in second)
        for claimed in (*first, *second):
            cells.unclaim(claimed.session_id)


async def test_an_http_node_and_its_metrics_cover_both_cells(places: CellPlaces) -> None:
    from prometheus_client.parser import text_string_to_metric_families
    from server_support import serving
    from starlette.requests import Request

    from turnkit.server import Principal
    from turnkit.server._metrics import metrics_for

    def by_tenant(request: Request) -> Principal | None:
        return Principal(id="ann", tenant=request.headers["X-Tenant"])

    agent = mover()
    async with (
        turnkit.RuntimeClient(agent, store=places.cells(by_region)) as rt,
        serving(rt, authenticate=by_tenant) as s,
        workers(places, agent, 1, BUDGET),
    ):
        for session, tenant in (("web-eu", "eu-7"), ("web-us", "us-7")):
            done = await s.client.post(
                s.path("m", session, "chat"), json={"text": "x"}, headers={"X-Tenant": tenant}
            )
            assert done.json()["status"] == "completed", done.text
    # Usage is exported by a runtime with a budget (a worker's, say), from every cell.
    async with turnkit.Runtime(agent, store=places.cells(by_region), budget=BUDGET) as rt:
        text = (await metrics_for(rt).scrape()).decode()
    calls = {
        sample.labels["tenant"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "turnkit_tenant_model_calls"
    }
    assert calls == {"eu-7": 1, "us-7": 1}
    assert places.rows("b", "SELECT session_id, tenant FROM turnkit_turns") == [("web-eu", "eu-7")]
    assert places.rows("a", "SELECT session_id, tenant FROM turnkit_turns") == [("web-us", "us-7")]


async def test_a_moving_tenants_deadlines_wait_and_then_fire_in_its_new_cell(
    places: CellPlaces,
) -> None:
    @tool
    async def approve(ctx: ToolContext) -> str:
        """Ask for approval, with a deadline."""
        answer = await ctx.request_input(
            "ok", "Approve?", expires_in=timedelta(hours=1), on_expiry="no"
        )
        return str(answer)

    def reply(messages: list[turnkit.Message]) -> ScriptedReply:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("approve", {})])
        return ScriptedReply(text=f"done: {messages[-1].result}")  # type: ignore[union-attr]

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=reply), tools=[approve])
    cells = places.cells(by_region)
    async with turnkit.Runtime(agent, store=cells) as rt:
        session = rt.session("a", "waits")
        turn_id = await session.submit("go", tenant="us-3")
        parked = await session.result(turn_id)
        assert parked.request is not None and parked.request.expires_at is not None
        late = parked.request.expires_at + 5

        def stop_once_verified(line: str) -> None:
            if line.startswith("verified"):
                raise Crash

        with pytest.raises(Crash):
            await move_tenant(cells, "us-3", "b", progress=stop_once_verified)
        # Fenced in both cells: the deadline fires in neither while the move is under way.
        assert await rt.timers.fire_due(cells, now=late) == 0
        await move_tenant(cells, "us-3", "b")
        assert await rt.timers.fire_due(cells, now=late) == 1

        async def completed() -> bool:
            record = await cells.session("waits").turn(turn_id)
            return record is not None and record.status == "completed"

        await eventually(completed, what="the expired turn completed")
    assert places.rows("b", "SELECT status FROM turnkit_turns WHERE session_id = 'waits'") == [
        ("completed",)
    ]


async def test_an_imported_session_is_placed_where_its_tenant_lives(places: CellPlaces) -> None:
    cells = places.cells(by_region)
    async with turnkit.Runtime(echo(), store=cells) as rt:
        await rt.session("echo", "original").turn("hi", tenant="eu-4")
        exported = await turnkit.export_session(cells, "original")
        await turnkit.import_session(cells, exported, session_id="copy")
        assert await cells.directory.cell_of("copy") == "b"
    assert places.rows("b", "SELECT session_id FROM turnkit_sessions ORDER BY 1") == [
        ("copy",),
        ("original",),
    ]


def delegating() -> list[turnkit.Agent]:
    """A parent agent whose turn hands its task to a ``researcher`` subagent, and that
    subagent; every model call reports usage, so the tenant's ledger counts both."""
    used = Usage(input_tokens=10, output_tokens=5)

    def parent_reply(messages: list[turnkit.Message]) -> ScriptedReply:
        last = messages[-1]
        if isinstance(last, UserMessage):
            call = tool_call("researcher", {"task": f"look up {last.text}"})
            return ScriptedReply(tool_calls=[call], usage=used)
        return ScriptedReply(text="parent: done", usage=used)

    def child_reply(messages: list[turnkit.Message]) -> ScriptedReply:
        return ScriptedReply(text=f"found {messages[-1].text}", usage=used)  # type: ignore[union-attr]

    parent = turnkit.Agent(
        name="parent",
        model=ScriptedModel(respond=parent_reply, record_calls=False),
        tools=[turnkit.subagent("researcher", description="Looks things up.")],
    )
    child = turnkit.Agent(
        name="researcher", model=ScriptedModel(respond=child_reply, record_calls=False)
    )
    return [parent, child]


@pytest.mark.slow
async def test_a_subagents_child_lives_and_moves_with_its_parents_tenant(
    places: CellPlaces,
) -> None:
    """A parent turn of a tenant in cell b runs a subagent: the child session is placed
    in b too (its turn is the tenant's) and a move of the tenant carries both."""
    cells = places.cells(by_region)
    async with turnkit.Runtime(delegating(), store=cells, budget=BUDGET) as rt:
        assert await rt.session("parent", "p").turn("prices", tenant="eu-7") == "parent: done"
        (child_sid,) = [s.session_id for s in await rt.sessions() if s.agent == "researcher"]
        assert await cells.directory.cell_of(child_sid) == "b"
        in_b = "SELECT session_id, tenant FROM turnkit_turns ORDER BY 1"
        assert places.rows("b", in_b) == [("p", "eu-7"), (child_sid, "eu-7")]
        assert places.rows("a", "SELECT count(*) FROM turnkit_turns") == [(0,)]
        usage = await cells.usage_by_tenant()
        assert set(usage) == {"eu-7"} and usage["eu-7"].calls == 3  # the parent's 2, the child's 1

        async def read_back(sid: str) -> tuple[object, ...]:
            session = cells.session(sid)
            return (
                (await session.load(from_index=0)).messages,
                await session.events(),
                await session.spend("eu-7"),
            )

        before = {sid: await read_back(sid) for sid in ("p", child_sid)}
        moved = await move_tenant(cells, "eu-7", "a")
        assert (moved.source, moved.target, moved.sessions) == ("b", "a", 2)
        assert {sid: await read_back(sid) for sid in ("p", child_sid)} == before
        assert await cells.usage_by_tenant() == usage
        assert await cells.directory.cell_of(child_sid) == "a"
    assert places.rows("a", in_b) == [("p", "eu-7"), (child_sid, "eu-7")]
    assert places.rows("b", "SELECT count(*) FROM turnkit_turns") == [(0,)]
