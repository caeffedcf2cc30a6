"""What the front-end endpoints make of their inputs, over HTTP in process: AG-UI
resume entries that cancel, name no open interrupt or mix the two; an AI SDK
approval for a question no approval can answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
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


def test_a_deadline_is_the_interrupts_expires_at_and_a_decision_takes_its_shape() -> None:
    from turnkit.server.agui._decisions import decision_value
    from turnkit.server.agui._events import interrupt_of

    options = turnkit.DecisionOptions(allowed=("approve", "reject"), arguments={"a": 1})
    request = InputRequest(
        id="q",
        prompt="?",
        turn_id="t",
        call_id="c",
        tool="x",
        kind="decision",
        decision=options,
        expires_at=1_800_000_000.25,
    )
    interrupt = interrupt_of(request)
    assert interrupt.expires_at == "2027-01-15T08:00:00.250+00:00"
    assert interrupt.reason == "tool_call" and interrupt.tool_call_id == "c"
    assert interrupt.response_schema is not None
    assert set(interrupt.response_schema["properties"]) == {"approved", "reason"}  # no edits
    assert (
        interrupt_of(
            InputRequest(id="q", prompt="?", turn_id="t", call_id="c", tool="x")
        ).expires_at
        is None
    )
    assert decision_value({"approved": True}) == {"decision": "approve"}
    assert decision_value({"approved": False}) == {"decision": "reject"}
    assert decision_value({"approved": True, "editedArgs": {"a": 2}}) == {
        "decision": "edit",
        "arguments": {"a": 2},
    }
    assert decision_value({"approved": False, "message": "m"}) == {
        "decision": "respond",
        "message": "m",
    }
    for other in (True, {"decision": "approve"}, {"approved": True, "extra": 1}):
        assert decision_value(other) == other  # for the check to take or refuse
    # A tool approval over the AI SDK: approve, or reject with the reason.
    assert approval_value(request, True, None) == {"decision": "approve"}
    assert approval_value(request, False, "no") == {"decision": "reject", "reason": "no"}
    only = replace(request, decision=turnkit.DecisionOptions(allowed=("edit",), arguments={}))
    with pytest.raises(HttpError) as refused:
        approval_value(only, True, None)
    assert refused.value.code == "not_an_approval"
