"""Issue 28 items 1-3: a session's turns run in the order they were acknowledged,
whatever a node's clock says and however many callers race, and resending a turn
id follows the turn already stored instead of failing or running it twice."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import StoreFactory
from server_support import serving
from suite_paths import CHILDREN

import turnkit
from turnkit.testing import ScriptedModel

ALICE = {"X-User": "alice"}


def echo_agent(calls: list[str]) -> turnkit.Agent:
    def respond(transcript: list[turnkit.Message]) -> str:
        text = transcript[-1].text  # type: ignore[union-attr]
        calls.append(text)
        return f"you said {text}"

    return turnkit.Agent(name="e", model=ScriptedModel(respond=respond), instructions=".")


async def test_item2_concurrent_turn_calls_run_in_call_order(make_store: StoreFactory) -> None:
    calls: list[str] = []
    async with turnkit.Runtime([echo_agent(calls)], store=make_store()) as runtime:
        session = runtime.session("e", "s1")
        texts = [f"m{n}" for n in range(6)]
        answers = await asyncio.gather(*(session.turn(t) for t in texts))
        assert answers == [f"you said {t}" for t in texts]
        assert calls == texts  # the order the process ran them
        users = [m.text for m in await session.messages() if isinstance(m, turnkit.UserMessage)]
        assert users == texts  # the transcript's
        stored = [await session.turn_record(t) for t in await _turn_ids(session)]
        assert [r.opening.text for r in stored if r is not None] == texts  # the store's


async def _turn_ids(session: Any) -> list[str]:
    return [m.turn_id for m in await session.messages() if isinstance(m, turnkit.UserMessage)]


async def test_item1_turn_order_is_the_stores_not_a_nodes_clock(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1, T2, T3 acknowledged in turn, T2 by a node whose clock is two seconds
    behind (the process clock, offset while it submits): the store's queue, which
    workers and recover() follow, keeps the order of acknowledgement."""
    calls: list[str] = []
    store = make_store()
    async with turnkit.RuntimeClient([echo_agent(calls)], store=store) as node:
        session = node.session("e", "s1")
        real = time.time
        ids = [await session.submit("T1")]
        monkeypatch.setattr(time, "time", lambda: real() - 2.0)  # a node running behind
        ids.append(await session.submit("T2"))
        monkeypatch.setattr(time, "time", real)
        ids.append(await session.submit("T3"))
        queue = [t.turn_id for t in await node.store.session("s1").unfinished()]
        assert queue == ids
        everywhere = [t.turn_id for t in await node.store.unfinished_turns()]
        assert everywhere == ids
    async with turnkit.Runtime([echo_agent(calls)], store=make_store()) as worker:
        await worker.recover()
    assert calls == ["T1", "T2", "T3"]


@pytest.mark.parametrize("verb", ["chat", "turns"])
async def test_item3_resending_a_turn_id_follows_the_stored_turn(
    make_store: StoreFactory, verb: str
) -> None:
    calls: list[str] = []
    runtime = turnkit.Runtime([echo_agent(calls)], store=make_store())
    async with runtime, serving(runtime) as served:
        url = served.path("e", "s1", verb)
        body = {"text": "hello", "turn_id": "t-retry"}
        first = await served.client.post(url, json=body, headers=ALICE)
        assert first.status_code == 200, first.text
        again = await served.client.post(url, json=body, headers=ALICE)
        assert again.status_code == 200, again.text
        if verb == "chat":
            assert (
                again.json()
                == first.json()
                == {
                    "status": "completed",
                    "turn_id": "t-retry",
                    "text": "you said hello",
                }
            )
        else:
            assert "event: turn.completed" in again.text
            assert "you said hello" in again.text
        # Five more at once, racing each other: one turn, run once.
        racing = await asyncio.gather(
            *(
                served.client.post(
                    served.path("e", "s1", "chat"),
                    json={"text": "again", "turn_id": "t-race"},
                    headers=ALICE,
                )
                for _ in range(5)
            )
        )
        assert {r.status_code for r in racing} == {200}, [r.text for r in racing]
        assert {r.json()["text"] for r in racing} == {"you said again"}
    assert calls == ["hello", "again"]


async def test_item3_submit_with_a_stored_turn_id_is_a_retry(make_store: StoreFactory) -> None:
    calls: list[str] = []
    async with turnkit.Runtime([echo_agent(calls)], store=make_store()) as runtime:
        session = runtime.session("e", "s1")
        first = await session.submit("hi", turn_id="t1")
        assert (await session.result(first)).text == "you said hi"
        assert await session.submit("hi", turn_id="t1") == "t1"
        assert (await session.result("t1")).text == "you said hi"
        # The stored opening is the turn's: a resend with other text follows it too.
        assert await session.submit("bye", turn_id="t1") == "t1"
        assert (await session.result("t1")).text == "you said hi"
    assert calls == ["hi"]


async def test_item3_an_http_node_that_hands_turns_to_workers_answers_a_resent_turn_id(
    pg_dsn: str, pg_schema: str
) -> None:
    """The issue's case: a node that hands its turns to workers answered a resent
    turn id 409 ("use submit() … not start()")."""
    from turnkit.stores import PostgresStore

    calls: list[str] = []
    async with turnkit.Runtime(
        [echo_agent(calls)], store=PostgresStore(pg_dsn, schema=pg_schema)
    ) as worker:
        await worker.session("e", "s1").turn("hello", turn_id="t1", owner="alice")
    node = turnkit.RuntimeClient([echo_agent(calls)], store=PostgresStore(pg_dsn, schema=pg_schema))
    async with node, serving(node) as served:
        body = {"text": "hello", "turn_id": "t1"}
        chat = await served.client.post(served.path("e", "s1", "chat"), json=body, headers=ALICE)
        assert chat.status_code == 200, chat.text
        assert chat.json()["text"] == "you said hello"
        stream = await served.client.post(served.path("e", "s1", "turns"), json=body, headers=ALICE)
        assert stream.status_code == 200 and "event: turn.completed" in stream.text
    assert calls == ["hello"]


@pytest.mark.parametrize("offset", [0.5, 2.0])
async def test_item1_a_node_process_whose_clock_is_behind_cannot_reorder_turns(
    pg_dsn: str, pg_schema: str, offset: float
) -> None:
    """The issue's case with real processes: T1, T2, T3 acknowledged in turn, T2 by
    another node process whose clock is ``offset`` seconds behind. The queue
    (which workers and recover() follow) keeps the order of acknowledgement."""
    import subprocess
    import sys

    from turnkit.stores import PostgresStore

    child = CHILDREN / "skewed_node_child.py"
    calls: list[str] = []
    node = turnkit.RuntimeClient([echo_agent(calls)], store=PostgresStore(pg_dsn, schema=pg_schema))
    async with node:
        session = node.session("e", "s1")
        ids = [await session.submit("T1")]
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(child), pg_dsn, pg_schema, "s1", "T2", str(offset)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        ids.append(done.stdout.strip())
        ids.append(await session.submit("T3"))
        assert [t.turn_id for t in await node.store.session("s1").unfinished()] == ids
    worker = turnkit.Runtime([echo_agent(calls)], store=PostgresStore(pg_dsn, schema=pg_schema))
    async with worker:
        await worker.recover()
    assert calls == ["T1", "T2", "T3"]
