"""turnkit agents served over A2A, driven by the official ``a2a-sdk`` client over TCP.

A task is a turn and its context a session; a park reads as ``input-required``
with every open question; the next message on the task answers through the same
checks as ``/resume``; cancel is turnkit's durable cancel.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a_support import DEADLINE, Gate, a2a_client, clerk, message, send, task_id_of
from eventually import eventually
from google.protobuf.json_format import MessageToDict
from server_support import serving

import turnkit
from turnkit.a2a import a2a_server, api_key_scheme, bearer_scheme
from turnkit.server import ServerLimits
from turnkit.stores import MemoryStore, SqliteStore

COMPLETED = TaskState.TASK_STATE_COMPLETED
INPUT_REQUIRED = TaskState.TASK_STATE_INPUT_REQUIRED
WORKING = TaskState.TASK_STATE_WORKING
CANCELED = TaskState.TASK_STATE_CANCELED


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
async def served(gate: Gate):
    runtime = turnkit.Runtime([clerk(gate)], store=MemoryStore())
    frontend = a2a_server(security_schemes={"user": api_key_scheme("X-User")})
    async with runtime, serving(runtime, frontends=[frontend]) as served:
        yield served
        gate.released.set()


async def test_the_card_names_the_agent_its_skills_endpoint_and_auth_scheme(served) -> None:
    async with a2a_client(served.url) as (_, card):
        assert card.name == "clerk"
        assert [s.id for s in card.skills] == ["refund", "hold"]
        assert card.skills[0].description.startswith("Refund an order")
        assert card.capabilities.streaming and not card.capabilities.push_notifications
        interfaces = [
            (i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces
        ]
        endpoint = f"{served.url}/agents/clerk/a2a"
        assert interfaces == [(endpoint, "JSONRPC", "1.0"), (endpoint, "JSONRPC", "0.3")]
        scheme = card.security_schemes["user"].api_key_security_scheme
        assert (scheme.location, scheme.name) == ("header", "X-User")
        assert list(card.security_requirements[0].schemes) == ["user"]
        # The instructions are not published unless the app chooses to.
        assert "refunds" not in MessageToDict(card).get("description", "")
    # The card is public (it says how to authenticate); an unknown agent is a 404.
    async with httpx.AsyncClient(base_url=served.url) as http:
        assert (await http.get("/agents/clerk/a2a/.well-known/agent-card.json")).status_code == 200
        missing = await http.get("/agents/nobody/a2a/.well-known/agent-card.json")
        assert missing.status_code == 404 and missing.json()["code"] == "unknown_agent"


async def test_a_protocol_0_3_client_is_served_on_the_same_endpoint(served) -> None:
    async with a2a_client(served.url, streaming=False) as (_, card):
        # The SDK's own 0.3 transport, picked by a card that offers only 0.3.
        legacy = AgentCard()
        legacy.CopyFrom(card)
        del legacy.supported_interfaces[0]
        async with httpx.AsyncClient(headers={"X-User": "ann"}, timeout=DEADLINE) as http:
            config = ClientConfig(httpx_client=http, streaming=False)
            client = ClientFactory(config).create(legacy)
            [response] = await send(client, message("old times"))
            assert response.task.status.state == COMPLETED
            got = await client.get_task(GetTaskRequest(id=response.task.id))
            assert got.artifacts[0].parts[0].text == "You said old times."
    # The wire says so: 0.3 method names, and the card's 0.3 fields.
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "role": "user",
                "messageId": "m-raw",
                "parts": [{"kind": "text", "text": "raw"}],
            }
        },
    }
    raw = await served.client.post("/agents/clerk/a2a", json=body, headers={"X-User": "ann"})
    assert raw.json()["result"]["status"]["state"] == "completed"
    card_json = (await served.client.get("/agents/clerk/a2a/.well-known/agent-card.json")).json()
    assert card_json["url"] == f"{served.url}/agents/clerk/a2a"
    assert card_json["protocolVersion"] == "0.3"


async def test_a_call_without_credentials_gets_the_apps_401_and_reaches_nothing(served) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hi"}]}},
    }
    async with httpx.AsyncClient(base_url=served.url) as http:
        refused = await http.post("/agents/clerk/a2a", json=body)
    assert refused.status_code == 401
    assert refused.json()["code"] == "unauthenticated"
    assert await served.runtime.store.session_page(limit=10) == []


async def test_send_blocks_until_the_task_completes_with_its_answer_artifact(served) -> None:
    async with a2a_client(served.url, streaming=False) as (client, _):
        [response] = await send(client, message("hello", context_id="ctx-1"))
        task = response.task
        assert task.status.state == COMPLETED
        assert task.context_id == "ctx-1" and task.id.startswith("ctx-1~")
        [artifact] = task.artifacts
        assert artifact.name == "answer" and artifact.parts[0].text == "You said hello."
        assert task.status.message.parts[0].text == "You said hello."
        # The task is the turn: the session holds it, under the task's id.
        session = served.runtime.store.session("ctx-1")
        record = await session.turn(task.id)
        assert record is not None and record.status == "completed"
        got = await client.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == COMPLETED and got.artifacts[0].parts[0].text == "You said hello."
        assert [m.parts[0].text for m in got.history] == ["hello", "You said hello."]


async def test_a_message_sent_twice_opens_one_task(served) -> None:
    async with a2a_client(served.url, streaming=False) as (client, _):
        first = await send(client, message("once", context_id="ctx-2", message_id="same"))
        again = await send(client, message("once", context_id="ctx-2", message_id="same"))
        assert task_id_of(first) == task_id_of(again)
        assert again[0].task.status.state == COMPLETED
        other = await send(client, message("once", context_id="ctx-2", message_id="other"))
        assert task_id_of(other) != task_id_of(first)
    snap = await served.runtime.store.session("ctx-2").load()
    assert [m.text for m in snap.messages if m.role == "user"] == ["once", "once"]


async def test_stream_sends_the_task_then_its_words_then_the_answer(served) -> None:
    async with a2a_client(served.url) as (client, _):
        events = await send(client, message("stream me"))
    assert events[0].HasField("task")
    assert events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    deltas = [
        e.status_update.status.message.parts[0].text
        for e in events
        if e.HasField("status_update")
        and e.status_update.metadata.fields["turnkit"].string_value == "text-delta"
    ]
    assert len(deltas) == 3 and "".join(deltas) == "You said stream me."
    answer = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert [a.artifact.parts[0].text for a in answer] == ["You said stream me."]
    last = events[-1].status_update
    assert last.status.state == COMPLETED
    assert last.status.message.parts[0].text == "You said stream me."


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_park_is_input_required_and_the_next_message_answers_it(
    served, streaming: bool
) -> None:
    async with a2a_client(served.url, streaming=streaming) as (client, _):
        asked = await send(client, message("refund A-1"))
        task_id = task_id_of(asked)
        status = asked[-1].status_update.status if streaming else asked[-1].task.status
        assert status.state == INPUT_REQUIRED
        questions = MessageToDict(status.message.parts[1].data)["questions"]
        assert [(q["id"], q["prompt"]) for q in questions] == [("approve", "Refund A-1?")]
        got = await client.get_task(GetTaskRequest(id=task_id))
        assert got.status.state == INPUT_REQUIRED
        # A text answer is read as JSON for a question with a schema: ``true``.
        answered = await send(client, message("true", task_id=task_id))
        final = answered[-1].status_update.status if streaming else answered[-1].task.status
        assert final.state == COMPLETED
        assert final.message.parts[0].text == "Done: A-1 refunded."
        # A completed task takes no more messages.
        with pytest.raises(UnsupportedOperationError, match="terminal"):
            await send(client, message("true", task_id=task_id))


async def test_several_open_questions_are_listed_and_answered_together(served) -> None:
    async with a2a_client(served.url, streaming=False) as (client, _):
        [asked] = await send(client, message("refund A-1 and A-3"))
        task = asked.task
        assert task.status.state == INPUT_REQUIRED
        questions = MessageToDict(task.status.message.parts[1].data)["questions"]
        ids = [q["id"] for q in questions]
        assert len(ids) == 2 and all(i.startswith("approve") for i in ids)
        assert "2 questions" in task.status.message.parts[0].text
        # Plain text cannot say which question it answers.
        with pytest.raises(InvalidParamsError, match="2 questions"):
            await send(client, message("true", task_id=task.id))
        answers = {ids[0]: True, ids[1]: False}
        [done] = await send(client, message(data={"answers": answers}, task_id=task.id))
        assert done.task.status.state == COMPLETED
        assert done.task.status.message.parts[0].text == "Done: A-1 refunded, A-3 kept."
    # Each answer is on record, given by the caller, through A2A.
    session = served.runtime.session("clerk", task.context_id)
    records = await session.answers(turn_id=task.id)
    assert [(r.input_id, r.by, r.source, r.value) for r in records] == [
        (ids[0], "ann", "a2a", True),
        (ids[1], "ann", "a2a", False),
    ]


async def test_answers_go_through_the_questions_answerers(served) -> None:
    async with a2a_client(served.url, streaming=False) as (ann, _):
        [asked] = await send(ann, message("refund A-2"))
        task_id = asked.task.id
        # Only the lead may approve A-2: the session's owner is refused.
        with pytest.raises(InvalidRequestError, match="answer"):
            await send(ann, message("true", task_id=task_id))
        # Someone who is neither the owner nor named learns nothing about the task.
        async with a2a_client(served.url, "bob", streaming=False) as (bob, _):
            with pytest.raises(TaskNotFoundError):
                await send(bob, message("true", task_id=task_id))
            with pytest.raises(TaskNotFoundError):
                await bob.get_task(GetTaskRequest(id=task_id))
        # The lead is named: their answer is taken, though they may not read the task.
        async with a2a_client(served.url, "lead", streaming=False) as (lead, _):
            [taken] = await send(lead, message("true", task_id=task_id))
            assert taken.task.id == task_id
            assert taken.task.status.state == TaskState.TASK_STATE_UNSPECIFIED
        done = await _settled(ann, task_id)
        assert done.status.message.parts[0].text == "Done: A-2 refunded."


async def test_cancel_stops_a_working_task_durably(served, gate: Gate) -> None:
    async with a2a_client(served.url) as (client, _):
        stream = client.send_message(message("hold"))
        first = await anext(stream)
        task_id = first.task.id
        await asyncio.wait_for(gate.holding.wait(), DEADLINE)
        cancelling = asyncio.create_task(client.cancel_task(CancelTaskRequest(id=task_id)))
        store = served.runtime.store.session(task_id.rpartition("~")[0])
        await _until(lambda: _cancel_asked(store, task_id))
        # The held tool finishes its call; the turn then stops at its next boundary,
        # which the cancel waits for (up to cancel_wait).
        gate.released.set()
        cancelled = await asyncio.wait_for(cancelling, DEADLINE)
        await stream.aclose()
        assert cancelled.status.state == CANCELED
        assert "cancelled" in cancelled.status.message.parts[0].text
        with pytest.raises(TaskNotCancelableError):
            await client.cancel_task(CancelTaskRequest(id=task_id))
    record = await served.runtime.store.session(task_id.rpartition("~")[0]).turn(task_id)
    assert record is not None and record.status == "cancelled"


async def test_a_dropped_stream_resubscribes_to_the_running_task(served, gate: Gate) -> None:
    async with a2a_client(served.url) as (client, _):
        stream = client.send_message(message("hold"))
        task_id = (await anext(stream)).task.id
        await asyncio.wait_for(gate.holding.wait(), DEADLINE)
        await stream.aclose()  # the client went away; the task goes on
        resumed = client.subscribe(SubscribeToTaskRequest(id=task_id))
        snapshot = await anext(resumed)
        assert snapshot.task.id == task_id and snapshot.task.status.state == WORKING
        gate.released.set()
        rest = [e async for e in resumed]
        assert rest[-1].status_update.status.state == COMPLETED
        assert rest[-1].status_update.status.message.parts[0].text == "Done: released."
        # A task that has ended has nothing to subscribe to.
        with pytest.raises(UnsupportedOperationError):
            [e async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]


async def test_unknown_and_foreign_task_ids_are_not_found(served) -> None:
    async with a2a_client(served.url, streaming=False) as (client, _):
        for task_id in ("nope", "ctx~" + "0" * 32, "x" * 300):
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=task_id))
        with pytest.raises(InvalidParamsError, match="no text"):
            await send(client, message())


async def test_a_bearer_scheme_is_declared_as_http_auth(gate: Gate) -> None:
    runtime = turnkit.Runtime([clerk(gate)], store=MemoryStore())
    frontend = a2a_server(security_schemes={"bearer": bearer_scheme()}, public_card=False)
    async with runtime, serving(runtime, frontends=[frontend]) as served:
        path = "/agents/clerk/a2a/.well-known/agent-card.json"
        assert (await served.client.get(path)).status_code == 401
        card = (await served.client.get(path, headers={"X-User": "ann"})).json()
        assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"


async def _cancel_asked(store, task_id: str) -> bool:
    record = await store.turn(task_id)
    return record is not None and record.cancel_reason is not None


async def _until(condition) -> None:
    await eventually(condition, what=f"{condition.__name__}", timeout=DEADLINE)


async def _settled(client, task_id: str):
    """The task once it has left ``working`` (polled, with a deadline)."""

    async def ended() -> Any:
        task = await client.get_task(GetTaskRequest(id=task_id))
        return task if task.status.state not in (WORKING, TaskState.TASK_STATE_SUBMITTED) else None

    return await eventually(ended, what=f"task {task_id} ended", timeout=DEADLINE)


async def test_any_node_on_the_store_gets_follows_and_cancels_a_task(tmp_path) -> None:
    """Node A runs turns; node B (an HTTP node, a ``RuntimeClient``) shares its
    SQLite file: B reads, follows and cancels A's task from the store alone."""
    gate = Gate()
    db = str(tmp_path / "shared.db")
    limits = ServerLimits(feed_poll_seconds=0.05)
    runner = turnkit.Runtime([clerk(gate)], store=SqliteStore(db))
    other = turnkit.RuntimeClient([clerk(Gate())], store=SqliteStore(db))
    async with (
        runner,
        other,
        serving(runner, frontends=[a2a_server()], limits=limits) as a,
        serving(other, frontends=[a2a_server()], limits=limits) as b,
        a2a_client(a.url) as (on_a, _),
        a2a_client(b.url) as (on_b, _),
    ):
        # Followed from B while A runs it.
        stream = on_a.send_message(message("hold"))
        task_id = (await anext(stream)).task.id
        await asyncio.wait_for(gate.holding.wait(), DEADLINE)
        await stream.aclose()
        followed = on_b.subscribe(SubscribeToTaskRequest(id=task_id))
        assert (await anext(followed)).task.status.state == WORKING
        gate.released.set()
        rest = [e async for e in followed]
        assert rest[-1].status_update.status.state == COMPLETED
        assert (await on_b.get_task(GetTaskRequest(id=task_id))).status.state == COMPLETED
        # Cancelled from B while A runs it: recorded in the store, A stops it.
        gate.holding.clear()
        gate.released.clear()
        stream = on_a.send_message(message("hold", message_id="second"))
        task_id = (await anext(stream)).task.id
        await asyncio.wait_for(gate.holding.wait(), DEADLINE)
        await stream.aclose()
        cancelling = asyncio.create_task(on_b.cancel_task(CancelTaskRequest(id=task_id)))
        store = runner.store.session(task_id.rpartition("~")[0])
        await _until(lambda: _cancel_asked(store, task_id))
        gate.released.set()
        assert (await asyncio.wait_for(cancelling, DEADLINE)).status.state == CANCELED
        assert (await on_a.get_task(GetTaskRequest(id=task_id))).status.state == CANCELED
