"""Operations endpoints: liveness and readiness on the HTTP app and ``ops_app``, and
the runtime's metrics scraped over HTTP and read with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eventually import eventually
from prometheus_client.parser import text_string_to_metric_families
from scale_out_support import cluster
from server_support import serving

import turnkit
from turnkit import MessageDeltaEvent
from turnkit.server import ops_app
from turnkit.stores import (
    MemoryStore,
    PostgresStore,
    SqliteStore,
    Store,
    TurnRecord,
    turn_rules,
)
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


@turnkit.tool
def look(what: str) -> str:
    """Looks something up."""
    return f"found {what}"


def looking_agent() -> turnkit.Agent:
    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        if isinstance(transcript[-1], turnkit.UserMessage):
            return ScriptedReply(tool_calls=[tool_call("look", {"what": "x"})])
        return ScriptedReply(text="Found it.")

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[look])


async def queue_turns(store: Store, session_id: str, count: int) -> None:
    """Store ``count`` submitted turns that nothing runs (as another node would)."""
    for i in range(count):
        record = TurnRecord(
            session_id=session_id,
            turn_id=f"q{i}",
            agent="a",
            status="queued",
            opening=turnkit.UserMessage(text="later", turn_id=f"q{i}"),
        )
        await store.session(session_id).commit([turn_rules.new_turn(record)])


def scraped(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and labels, read by prometheus_client."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def get(app: Any, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.get(path)


class Stats:
    """A worker as the metrics see it."""

    claimed = 7
    takeovers = 2
    running = 3


async def test_metrics_count_steps_endings_the_queue_and_the_worker(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "ops.db")
    async with turnkit.Runtime(looking_agent(), store=store) as runtime:
        app = ops_app(runtime, worker=Stats())  # counting starts here
        session = runtime.session("a", "s1")
        for _ in range(3):
            assert (await session.result(session.start("look"))).status == "completed"
        await queue_turns(store, "s2", 4)
        answer = await get(app, "/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain")
        got = scraped(answer.text)
    assert got[("turnkit_turns", (("status", "queued"),))] == 4
    assert got[("turnkit_turns", (("status", "running"),))] == 0
    assert got[("turnkit_store_up", ())] == 1
    assert got[("turnkit_turns_ended_total", (("status", "completed"),))] == 3
    # Each turn: a tool step after its first model step, a model step after the tool.
    assert got[("turnkit_step_seconds_count", (("kind", "tool"),))] == 3
    assert got[("turnkit_step_seconds_count", (("kind", "model"),))] == 6
    assert got[("turnkit_claims_total", ())] == 7
    assert got[("turnkit_takeovers_total", ())] == 2
    assert got[("turnkit_worker_running", ())] == 3
    assert ("turnkit_deliveries_running", ()) in got


async def test_each_runtime_has_a_registry_of_its_own() -> None:
    agent = looking_agent()
    async with (
        turnkit.Runtime(agent, store=MemoryStore()) as first,
        turnkit.Runtime(agent, store=MemoryStore()) as second,
    ):
        apps = ops_app(first), ops_app(second)
        session = first.session("a", "s")
        await session.result(session.start("look"))
        one = scraped((await get(apps[0], "/metrics")).text)
        other = scraped((await get(apps[1], "/metrics")).text)
    assert one[("turnkit_turns_ended_total", (("status", "completed"),))] == 1
    assert ("turnkit_turns_ended_total", (("status", "completed"),)) not in other
    assert ("turnkit_claims_total", ()) not in one  # no worker given


async def test_probes_on_the_http_app_need_no_credentials_and_say_when_the_store_is_gone(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "probe.db")
    runtime = turnkit.Runtime(looking_agent(), store=store)
    async with serving(runtime) as served:
        assert (await served.client.get("/healthz")).json() == {"status": "ok"}
        closed = await served.client.get("/readyz")
        assert closed.status_code == 503 and "not open" in closed.json()["reason"]
        async with runtime:
            ready = await served.client.get("/readyz")
            assert ready.status_code == 200, ready.text
            await store.close()  # the database goes away under an open runtime
            gone = await served.client.get("/readyz")
            assert gone.status_code == 503 and "store" in gone.json()["reason"]
            assert (await served.client.get("/healthz")).status_code == 200
            await store.open()
        assert (await served.client.get("/agents")).status_code == 401  # the rest is guarded


async def test_on_postgres_the_queue_depth_and_the_relay_lag_are_measured(
    pg_dsn: str, pg_schema: str
) -> None:
    agent = looking_agent()
    sender = PostgresStore(pg_dsn, schema=pg_schema)
    async with (
        turnkit.Runtime(agent, store=PostgresStore(pg_dsn, schema=pg_schema)) as runtime,
        turnkit.Runtime(agent, store=sender),
    ):
        await queue_turns(runtime.store, "waiting", 3)
        app = ops_app(runtime)
        assert (await get(app, "/readyz")).status_code == 200
        # A feed here follows a session whose deltas another process relays.
        assert runtime.relay is not None and sender.relay is not None
        heard: asyncio.Queue[Any] = asyncio.Queue()
        runtime.relay.follow("s", heard.put_nowait)
        await eventually(
            lambda: getattr(runtime.relay, "listening", False), what="the relay listening"
        )
        sender.relay.publish(MessageDeltaEvent(turn_id="t", session_id="s", text="hi", next_seq=1))
        await asyncio.wait_for(heard.get(), 10)
        got = scraped((await get(app, "/metrics")).text)
    assert got[("turnkit_turns", (("status", "queued"),))] == 3
    assert got[("turnkit_relay_lag_seconds_count", ())] >= 1
    assert got[("turnkit_relay_dropped_total", ())] == 0
    assert got[("turnkit_fenced_deliveries_total", ())] == 0
    for reason in ("forged", "malformed", "stale"):
        assert got[("turnkit_relay_rejected_total", (("reason", reason),))] == 0


@pytest.fixture
async def nodes(pg_dsn: str, pg_schema: str, tmp_path: Path) -> AsyncIterator[Any]:
    """An HTTP node here, and workers started as the test asks (tests/core/test_scale_out)."""
    hold = tmp_path / "hold"
    hold.mkdir()
    async with cluster(pg_dsn, pg_schema, hold, tmp_path) as found:
        yield found


@pytest.mark.slow
async def test_a_worker_serves_its_probes_and_metrics_on_its_ops_port(nodes: Any) -> None:
    port = free_port()
    worker = nodes.start_worker("--ops-port", str(port))
    turn_id = await nodes.submit("ops", "note this")
    await nodes.wait_for(
        "SELECT 1 FROM turnkit_turns WHERE turn_id = %s AND status = 'completed'", turn_id
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        got = scraped((await client.get("/metrics")).text)
        # A page rebinding its own name to the port reads nothing (421).
        rebound = await client.get("/metrics", headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 421
    assert got[("turnkit_claims_total", ())] >= 1
    assert got[("turnkit_takeovers_total", ())] == 0
    assert got[("turnkit_turns_ended_total", (("status", "completed"),))] >= 1
    assert got[("turnkit_step_seconds_count", (("kind", "tool"),))] >= 1
    worker.send_signal(signal.SIGTERM)  # the ops port leaves the drain to the worker
    assert await asyncio.to_thread(worker.wait, 30) == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_workers_pool_size_bounds_its_store_pools() -> None:
    from turnkit.cli._open import open_store

    store = open_store("postgresql://db.invalid/app", pool_size=3)
    assert isinstance(store, PostgresStore) and store.max_size == 3
    default = open_store("postgresql://db.invalid/app")
    assert isinstance(default, PostgresStore) and default.max_size == 10
