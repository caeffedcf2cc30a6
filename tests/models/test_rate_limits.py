"""Model rate limits: a real OpenAI-wire server on 127.0.0.1 records when each request
arrives, and never sees more than the limit in any sliding window, whether one
runtime runs the turns or three workers on one PostgreSQL share the limit through
the store. A turn over the limit waits parked on a timer, holding no worker: another
agent's turns run meanwhile. The window is shortened from a minute to keep the test
fast (``RateLimit(window=...)``)."""

from __future__ import annotations

import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from fakes import openai_wire as wire
from fakes.server import Canned, FakeProvider
from worker_support import pg_worker

import turnkit
from turnkit import RateLimit
from turnkit.models import openai
from turnkit.stores import PostgresStore, SqliteStore
from turnkit.testing import ScriptedModel


class Arrivals:
    """When each request reached the fake provider, by the model it asked for."""

    def __init__(self) -> None:
        self.at: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def respond(self, body: Any) -> Canned:
        with self._lock:
            self.at.setdefault(body["model"], []).append(time.time())
        return wire.completion("done")

    def most_in_any_window(self, model: str, window: float) -> int:
        """The most requests for ``model`` that arrived within ``window`` seconds of
        one another (every window starting at an arrival: where the most can be)."""
        times = sorted(self.at.get(model, []))
        return max(
            (sum(1 for t in times if start <= t < start + window) for start in times), default=0
        )


def agent(name: str, model: str, server: FakeProvider, **options: Any) -> turnkit.Agent:
    url = server.url + "/v1"
    return turnkit.Agent(
        name=name, model=openai(model, api_key="test-key", base_url=url, **options)
    )


def test_a_rate_limit_refuses_nonsense() -> None:
    with pytest.raises(turnkit.ConfigurationError, match="requests_per_minute"):
        RateLimit("m", requests_per_minute=0)
    with pytest.raises(turnkit.ConfigurationError, match="needs requests_per_minute"):
        RateLimit("m")
    with pytest.raises(turnkit.ConfigurationError, match="window"):
        RateLimit("m", requests_per_minute=1, window=0)
    with pytest.raises(turnkit.ConfigurationError, match="names one model twice"):
        turnkit.Runtime(
            turnkit.Agent(name="a", model=ScriptedModel([])),
            store=turnkit.stores.MemoryStore(),
            rate_limits=[RateLimit("m", requests_per_minute=1)] * 2,
        )


async def test_a_runtime_keeps_its_model_calls_under_the_limit(tmp_path: Path) -> None:
    arrivals = Arrivals()
    limit = RateLimit("limited-model", requests_per_minute=3, window=1.0)
    with FakeProvider(respond=arrivals.respond) as server:
        store = SqliteStore(tmp_path / "rates.db")
        async with turnkit.Runtime(
            agent("a", "limited-model", server), store=store, rate_limits=[limit]
        ) as rt:
            turns = []
            for i in range(8):
                s = rt.session("a", f"s{i}")
                turns.append((s, await s.submit("go")))

            async def all_done() -> bool:
                for s, tid in turns:
                    record = await store.session(s.session_id).turn(tid)
                    if record is None or record.status != "completed":
                        return False
                return True

            await eventually(all_done, what="every turn", timeout=60)
            waited = [
                e
                for s, _ in turns
                for e in await s.events()
                if e.type == "input.requested" and "rate limit" in str(e.to_dict())
            ]
    assert len(arrivals.at["limited-model"]) == 8
    assert arrivals.most_in_any_window("limited-model", 1.0) <= 3
    assert waited, "no turn waited on the limit"


@pytest.mark.slow
async def test_three_workers_share_one_limit_and_run_other_turns_meanwhile(
    pg_dsn: str, pg_schema: str
) -> None:
    """20 turns of the limited model at 4 per second take 5 windows; the other
    agent's 20 turns, on a model without a limit, all finish while the limited
    ones still wait (they wait parked, not in a worker's slot)."""
    arrivals = Arrivals()
    limits = [RateLimit("limited-model", requests_per_minute=4, window=1.0)]
    with FakeProvider(respond=arrivals.respond) as server:
        agents = [agent("slow", "limited-model", server), agent("free", "free-model", server)]
        node_store = PostgresStore(pg_dsn, schema=pg_schema, busy_timeout=30.0)
        async with (
            turnkit.RuntimeClient(agents, store=node_store) as node,
            AsyncExitStack() as stack,
        ):
            for _ in range(3):
                await stack.enter_async_context(
                    pg_worker(pg_dsn, pg_schema, agents, rate_limits=limits, slots=16)
                )
            slow, free = [], []
            for i in range(20):
                s = node.session("slow", f"slow{i}")
                slow.append((s, await s.submit("go", tenant="t1")))
            for i in range(20):
                s = node.session("free", f"free{i}")
                free.append((s, await s.submit("go", tenant="t2")))

            async def statuses(turns: list[Any]) -> list[str]:
                found = []
                for s, tid in turns:
                    record = await node_store.session(s.session_id).turn(tid)
                    found.append(record.status if record is not None else "missing")
                return found

            async def free_done() -> bool:
                return all(x == "completed" for x in await statuses(free))

            await eventually(free_done, what="the unlimited agent's turns", timeout=60)
            slow_now = await statuses(slow)
            assert slow_now.count("completed") < 20, slow_now

            async def slow_done() -> bool:
                return all(x == "completed" for x in await statuses(slow))

            await eventually(slow_done, what="the limited agent's turns", timeout=60)
    assert len(arrivals.at["limited-model"]) == 20
    assert arrivals.most_in_any_window("limited-model", 1.0) <= 4
    assert len(arrivals.at["free-model"]) == 20


async def test_a_429_with_retry_after_holds_every_call_to_the_model_back() -> None:
    """The provider refuses the first call for load, asking for 1.5 s: that turn
    waits on its retry timer, and another session's turn, which would otherwise be
    let go at once, waits for the same moment (the limit is blocked until then)."""
    arrivals: list[float] = []
    lock = threading.Lock()

    def respond(body: Any) -> Canned:
        with lock:
            arrivals.append(time.time())
            if len(arrivals) == 1:
                return wire.error(429, "slow down", retry_after_ms="1500")
        return wire.completion("done")

    limit = RateLimit("m", requests_per_minute=1000)
    with FakeProvider(respond=respond) as server:
        store = turnkit.stores.MemoryStore()
        # (No retries inside the SDK: the refusal reaches turnkit, as the last one would.)
        model = agent("a", "m", server, max_retries=0)
        async with turnkit.Runtime(model, store=store, rate_limits=[limit]) as rt:
            first = rt.session("a", "s1")
            one = await first.submit("go")
            refused = await first.result(one)
            assert refused.status == "suspended" and len(arrivals) == 1
            second = rt.session("a", "s2")
            two = await second.submit("go")

            async def both_done() -> bool:
                records = [await store.session(s).turn(t) for s, t in (("s1", one), ("s2", two))]
                return all(r is not None and r.status == "completed" for r in records)

            await eventually(both_done, what="both turns", timeout=60)
    assert len(arrivals) == 3
    assert min(arrivals[1:]) >= arrivals[0] + 1.5
