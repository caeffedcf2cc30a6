"""The front-end endpoints keep the HTTP surface's authentication and per-session
authorization: 401 without a principal, and another's session answers exactly as a
missing one (404 ``unknown_session``, or the reconnect's 204), with nothing applied."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from frontend_support import StoryModel, shop_agent
from server_support import by_header

import turnkit
from turnkit.server import ServerLimits, create_app
from turnkit.server.agui import ag_ui
from turnkit.server.aisdk import ai_sdk
from turnkit.stores import MemoryStore

ANN, BOB = {"X-User": "ann"}, {"X-User": "bob"}
CHAT = "/agents/shop/ai-sdk/chat"


def user_says(chat: str, text: str) -> dict[str, Any]:
    parts = [{"type": "text", "text": text}]
    return {
        "id": chat,
        "trigger": "submit-message",
        "messages": [{"id": "m", "role": "user", "parts": parts}],
    }


def approves(chat: str, turn_id: str, approval: str) -> dict[str, Any]:
    part = {
        "type": "dynamic-tool",
        "toolName": "refund",
        "toolCallId": "call_refund",
        "state": "approval-responded",
        "input": {"order": "A-1"},
        "approval": {"id": approval, "approved": True},
    }
    message = {"id": turn_id, "role": "assistant", "parts": [part]}
    return {"id": chat, "trigger": "submit-message", "messages": [message]}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    runtime = turnkit.Runtime(shop_agent(StoryModel()), store=MemoryStore())
    app = create_app(
        runtime,
        authenticate=by_header,
        frontends=[ai_sdk(), ag_ui()],
        limits=ServerLimits(max_body_bytes=4096),
    )
    transport = httpx.ASGITransport(app=app)
    async with runtime, httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        yield client


async def parked(client: httpx.AsyncClient) -> str:
    """Ann's chat ``c1``, parked on a refund question; its turn id."""
    reply = await client.post(CHAT, json=user_says("c1", "refund A-1"), headers=ANN)
    assert '"tool-approval-request"' in reply.text
    pending = (await client.get("/agents/shop/sessions/c1/pending", headers=ANN)).json()
    return str(pending["request"]["turn_id"])


async def test_without_a_principal_every_route_is_401(client: httpx.AsyncClient) -> None:
    assert (await client.post(CHAT, json=user_says("c1", "hi"))).status_code == 401
    assert (await client.get(f"{CHAT}/c1/stream")).status_code == 401
    assert (await client.post(f"{CHAT}/c1/stop")).status_code == 401
    assert (await client.post("/agents/shop/ag-ui", json={})).status_code == 401
    assert (await client.get("/agents/shop/ag-ui/capabilities")).status_code == 401


async def test_another_users_chat_is_a_missing_one(client: httpx.AsyncClient) -> None:
    turn_id = await parked(client)
    missing = await client.post(CHAT, json=user_says("nope", "hi"), headers=BOB)
    assert missing.status_code == 200  # a new chat becomes bob's
    theirs = await client.post(CHAT, json=user_says("c1", "hi"), headers=BOB)
    assert theirs.status_code == 404 and theirs.json()["code"] == "unknown_session"
    answer = await client.post(CHAT, json=approves("c1", turn_id, "approve-refund"), headers=BOB)
    assert answer.json() == theirs.json()
    stop = await client.post(f"{CHAT}/c1/stop", headers=BOB)
    assert stop.json() == theirs.json()
    # The reconnect of a chat one may not read is the reconnect of one with nothing running.
    assert (await client.get(f"{CHAT}/c1/stream", headers=BOB)).status_code == 204
    run = {
        "threadId": "c1",
        "runId": "r",
        "messages": [{"id": "u", "role": "user", "content": "hi"}],
    }
    assert (await client.post("/agents/shop/ag-ui", json=run, headers=BOB)).json() == theirs.json()
    resume = {
        **run,
        "resume": [{"interruptId": "approve-refund", "status": "resolved", "payload": True}],
    }
    assert (
        await client.post("/agents/shop/ag-ui", json=resume, headers=BOB)
    ).json() == theirs.json()
    pending = (await client.get("/agents/shop/sessions/c1/pending", headers=ANN)).json()
    assert pending["request"]["id"] == "approve-refund"  # nothing was applied


async def test_the_owner_reconnects_to_a_parked_turn_and_answers_it(
    client: httpx.AsyncClient,
) -> None:
    turn_id = await parked(client)
    again = await client.get(f"{CHAT}/c1/stream", headers=ANN)
    assert again.status_code == 200 and '"tool-approval-request"' in again.text
    assert again.headers["x-vercel-ai-ui-message-stream"] == "v1"
    answer = await client.post(CHAT, json=approves("c1", turn_id, "approve-refund"), headers=ANN)
    assert '"output":"A-1 refunded"' in answer.text
    assert answer.text.endswith('{"type":"finish","finishReason":"stop"}\n\ndata: [DONE]\n\n')
    assert (await client.get(f"{CHAT}/c1/stream", headers=ANN)).status_code == 204


async def test_bodies_are_checked_before_anything_runs(client: httpx.AsyncClient) -> None:
    big = user_says("c2", "x" * 5000)
    assert (await client.post(CHAT, json=big, headers=ANN)).status_code == 413
    regenerate = {**user_says("c2", "hi"), "trigger": "regenerate-message"}
    refused = await client.post(CHAT, json=regenerate, headers=ANN)
    assert refused.status_code == 400 and "regenerates nothing" in refused.json()["error"]
    not_a_run = await client.post("/agents/shop/ag-ui", json={"threadId": "c2"}, headers=ANN)
    assert not_a_run.status_code == 400 and "RunAgentInput" in not_a_run.json()["error"]
    unknown = await client.post(
        "/agents/nobody/ai-sdk/chat", json=user_says("c2", "hi"), headers=ANN
    )
    assert unknown.status_code == 404 and unknown.json()["code"] == "unknown_agent"
