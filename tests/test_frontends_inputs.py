"""What the front-end endpoints make of their inputs, over HTTP in process: AG-UI
resume entries that cancel, name no open interrupt or mix the two; an AI SDK
approval for a question no approval can answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from frontend_support import StoryModel, shop_agent
from server_support import by_header

import turnkit
from turnkit import InputRequest
from turnkit.server import create_app
from turnkit.server._bodies import HttpError
from turnkit.server.agui import ag_ui
from turnkit.server.aisdk import approval_value
from turnkit.stores import MemoryStore

ANN = {"X-User": "ann"}
RUNS = "/agents/shop/ag-ui"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    runtime = turnkit.Runtime(shop_agent(StoryModel()), store=MemoryStore())
    app = create_app(runtime, authenticate=by_header, frontends=[ag_ui()])
    transport = httpx.ASGITransport(app=app)
    async with runtime, httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        yield client


def run_input(thread: str, **more: Any) -> dict[str, Any]:
    message = {"id": "u", "role": "user", "content": "refund A-1"}
    return {"threadId": thread, "runId": "r1", "messages": [message], **more}


def events(reply: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line.removeprefix("data: ")) for line in reply.text.splitlines() if line]


async def parked(client: httpx.AsyncClient, thread: str) -> dict[str, Any]:
    ended = events(await client.post(RUNS, json=run_input(thread), headers=ANN))[-1]
    assert ended["outcome"]["type"] == "interrupt"
    return dict(ended["outcome"]["interrupts"][0])


async def test_resume_entries_that_all_cancel_cancel_the_parked_turn(
    client: httpx.AsyncClient,
) -> None:
    interrupt = await parked(client, "t1")
    resume = [{"interruptId": interrupt["id"], "status": "cancelled"}]
    reply = await client.post(RUNS, json=run_input("t1", resume=resume), headers=ANN)
    assert [e["type"] for e in events(reply)] == ["RUN_STARTED", "RUN_FINISHED"]
    assert events(reply)[-1]["outcome"] == {"type": "cancelled"}
    pending = (await client.get("/agents/shop/sessions/t1/pending", headers=ANN)).json()
    assert pending == {"request": None, "requests": []}


async def test_resume_entries_must_name_open_interrupts_and_agree(
    client: httpx.AsyncClient,
) -> None:
    interrupt = await parked(client, "t2")
    wrong = [{"interruptId": "no-such", "status": "resolved", "payload": True}]
    refused = await client.post(RUNS, json=run_input("t2", resume=wrong), headers=ANN)
    assert refused.status_code == 409 and "no-such" in refused.json()["error"]
    mixed = [
        {"interruptId": interrupt["id"], "status": "resolved", "payload": True},
        {"interruptId": interrupt["id"], "status": "cancelled"},
    ]
    refused = await client.post(RUNS, json=run_input("t2", resume=mixed), headers=ANN)
    assert refused.status_code == 400
    bad = [{"interruptId": interrupt["id"], "status": "resolved", "payload": "yes"}]
    refused = await client.post(RUNS, json=run_input("t2", resume=bad), headers=ANN)
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_answer"
    pending = (await client.get("/agents/shop/sessions/t2/pending", headers=ANN)).json()
    assert pending["request"]["id"] == interrupt["id"]  # still waiting, nothing applied


def test_an_approval_answers_only_yes_or_no_questions() -> None:
    def asking(schema: dict[str, Any] | None) -> InputRequest:
        return InputRequest(id="q", prompt="?", turn_id="t", call_id="c", tool="x", schema=schema)

    assert approval_value(asking(None), True, None) is True
    assert approval_value(asking({"type": "boolean"}), False, "no") is False
    note = {"type": "object", "properties": {"approved": {"type": "boolean"}, "note": {}}}
    assert approval_value(asking(note), False, "too much") == {
        "approved": False,
        "note": "too much",
    }
    with pytest.raises(HttpError) as refused:
        approval_value(asking({"type": "string"}), True, None)
    assert refused.value.status == 422 and refused.value.code == "not_an_approval"
