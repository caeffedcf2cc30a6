"""Cells: one deployment over two PostgreSQL databases of the test server. Tenants are
placed by a stable hash or by the app's function and stay where they were first
placed; one runtime's workers run the turns of both cells; the lists an operator
reads cover both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from cells_support import CellPlaces, by_region, places, second_database

import turnkit
from turnkit.stores.postgres import Cells, stable_hash
from turnkit.testing import ScriptedModel

__all__ = ["places", "second_database"]  # the fixtures, used by name


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def echo() -> turnkit.Agent:
    return turnkit.Agent(
        name="echo",
        model=ScriptedModel(respond=lambda m: f"re: {m[-1].text}", record_calls=False),  # type: ignore[union-attr]
    )


@asynccontextmanager
async def workers(places: CellPlaces, agent: turnkit.Agent, n: int) -> AsyncIterator[None]:
    """``n`` workers, each in a runtime of its own over both cells."""
    async with AsyncExitStack() as stack:
        for _ in range(n):
            rt = await stack.enter_async_context(
                turnkit.Runtime(agent, store=places.cells(by_region, relay_events=False))
            )
            w = turnkit.Worker(rt, poll=0.2, concurrency=4)
            task = asyncio.ensure_future(w.run())
            stack.push_async_callback(_stopped, w, task)
        yield


async def _stopped(w: turnkit.Worker, task: asyncio.Future[None]) -> None:
    w.stop()
    await asyncio.wait_for(task, 30)


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
    async with turnkit.Runtime(echo(), store=places.cells(by_region), run_turns=False) as rt:
        for tenant, session in (("eu-1", "s-eu"), ("us-1", "s-us"), ("", "s-default")):
            await rt.session("echo", session).submit("hi", tenant=tenant)
    assert places.rows("a", "SELECT session_id FROM turnkit_sessions ORDER BY 1") == [
        ("s-default",),
        ("s-us",),
    ]
    assert places.rows("b", "SELECT session_id, tenant FROM turnkit_turns") == [("s-eu", "eu-1")]
    # Another deployment's placement would put eu-1 in a: its tenant is pinned to b.
    everything_in_a = places.cells(lambda tenant: "a")
    async with turnkit.Runtime(echo(), store=everything_in_a, run_turns=False) as rt:
        await rt.session("echo", "s-eu-2").submit("again", tenant="eu-1")
        await rt.session("echo", "s-new").submit("new", tenant="eu-2")
        assert (await rt.store.session("s-eu").unfinished())[0].tenant == "eu-1"
    assert places.rows("b", "SELECT session_id FROM turnkit_sessions ORDER BY 1") == [
        ("s-eu",),
        ("s-eu-2",),
    ]
    assert ("s-new",) in places.rows("a", "SELECT session_id FROM turnkit_sessions")


async def test_a_placement_naming_no_cell_is_refused_naming_it(places: CellPlaces) -> None:
    async with turnkit.Runtime(echo(), store=places.cells(lambda t: "mars"), run_turns=False) as rt:
        with pytest.raises(turnkit.ConfigurationError, match="'mars', which is not one of"):
            await rt.session("echo", "s1").submit("hi", tenant="acme")


async def test_one_set_of_workers_runs_the_turns_of_both_cells(places: CellPlaces) -> None:
    agent = echo()
    tenants = ["eu-a", "eu-b", "us-a", "us-b"]
    async with turnkit.Runtime(agent, store=places.cells(by_region), run_turns=False) as node:
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
