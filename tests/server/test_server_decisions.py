"""Decisions over HTTP: ``/pending`` offers what the request allows, ``/resume`` takes
each kind (checked like any answer), and ``/answers`` reads the record back."""

from __future__ import annotations

from typing import Any

import pytest
from httpx_sse import aconnect_sse
from server_support import Served, decode, serving, snapshot

import turnkit
from turnkit import ActionContext, Approval, define_action
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

ALICE = {"X-User": "alice"}
SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "cents": {"type": "integer", "minimum": 1}},
    "required": ["order_id", "cents"],
}


def refund_agent(ran: list[dict[str, Any]]) -> turnkit.Agent:
    def run(data: dict[str, Any], actx: ActionContext) -> str:
        ran.append(data)
        return f"refunded {data['cents']}"

    refund = define_action(
        name="refund",
        description="Refund an order.",
        input_schema=SCHEMA,
        run=run,
        approval=Approval(allowed=("approve", "edit", "reject", "respond")),
    )

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage):
            return ScriptedReply(tool_calls=[tool_call("refund", {"order_id": "A1", "cents": 500})])
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(text=f"Tool said: {last.result}")

    return turnkit.Agent(name="shop", model=ScriptedModel(respond=respond), tools=[refund])


async def sse(served: Served, url: str, body: dict[str, Any]) -> list[Any]:
    async with aconnect_sse(served.client, "POST", url, json=body, headers=dict(ALICE)) as source:
        assert source.response.status_code == 200, await source.response.aread()
        return decode([frame async for frame in source.aiter_sse()])


async def parked(served: Served) -> dict[str, Any]:
    frames = await sse(served, served.path("shop", "s1", "turns"), {"text": "refund A1"})
    assert frames[-1].event == "input.requested"
    pending = await served.client.get(served.path("shop", "s1", "pending"), headers=ALICE)
    request: dict[str, Any] = pending.json()["request"]
    return request


async def test_pending_offers_the_decisions_and_the_proposal(open_runtime: Any) -> None:
    runtime = await open_runtime(refund_agent([]))
    async with serving(runtime) as served:
        request = await parked(served)
    assert request["kind"] == "decision" and request["tool"] == "refund"
    assert request["decision"] == {
        "allowed": ["approve", "edit", "reject", "respond"],
        "arguments": {"order_id": "A1", "cents": 500},
        "arguments_schema": SCHEMA,
    }
    assert request["answerers"] == [{"kind": "user", "user_id": "alice"}]
    assert isinstance(request["asked_at"], float)


@pytest.mark.parametrize(
    ("value", "ran", "says"),
    [
        ({"decision": "approve"}, [{"order_id": "A1", "cents": 500}], "Tool said: refunded 500"),
        (
            {"decision": "edit", "arguments": {"order_id": "A1", "cents": 120}},
            [{"order_id": "A1", "cents": 120}],
            "Tool said: refunded 120",
        ),
        ({"decision": "reject", "reason": "too much"}, [], "Reason: too much"),
        ({"decision": "respond", "message": "ask for a photo"}, [], "ask for a photo"),
    ],
)
async def test_each_decision_resumes_over_http_and_is_recorded(
    open_runtime: Any, value: dict[str, Any], ran: list[Any], says: str
) -> None:
    done: list[dict[str, Any]] = []
    runtime = await open_runtime(refund_agent(done))
    async with serving(runtime) as served:
        request = await parked(served)
        body = {"turn_id": request["turn_id"], "input_id": request["id"], "value": value}
        frames = await sse(served, served.path("shop", "s1", "resume"), body)
        assert frames[0].event == "input.answered"
        assert frames[0].data["value"] == value and frames[0].data["source"] == "http"
        assert frames[0].data["kind"] == "decision" and frames[0].data["by"] == "alice"
        assert frames[-1].event == "turn.completed" and says in frames[-1].data["text"]
        assert done == ran
        answers = await served.client.get(served.path("shop", "s1", "answers"), headers=ALICE)
        assert answers.status_code == 200
        (record,) = answers.json()["answers"]
        assert (record["by"], record["source"], record["tool"]) == ("alice", "http", "refund")
        assert record["decision"] == value and record["input_id"] == request["id"]
        assert isinstance(record["at"], float)
        # The record is the session's: nobody else reads it.
        other = await served.client.get(
            served.path("shop", "s1", "answers"), headers={"X-User": "mallory"}
        )
        assert other.status_code == 404


async def test_a_decision_that_does_not_fit_is_a_422_and_changes_nothing(
    open_runtime: Any,
) -> None:
    runtime = await open_runtime(refund_agent([]))
    async with serving(runtime) as served:
        request = await parked(served)
        before = await snapshot(runtime)
        url = served.path("shop", "s1", "resume")
        for value, problem in [
            ({"decision": "edit", "arguments": {"order_id": "A1", "cents": 0}}, "cents"),
            ({"decision": "edit", "arguments": {"order_id": "A1"}}, "required"),
            ({"decision": "veto"}, "one of approve, edit, reject, respond"),
            (True, "a decision is an object"),
        ]:
            body = {"turn_id": request["turn_id"], "input_id": request["id"], "value": value}
            refused = await served.client.post(url, json=body, headers=ALICE)
            assert refused.status_code == 422, refused.text
            assert problem in refused.json()["error"]
            assert await snapshot(runtime) == before
        # Someone else's decision is refused like any answer (here: as no session at all).
        body = {
            "turn_id": request["turn_id"],
            "input_id": request["id"],
            "value": {"decision": "approve"},
        }
        refused = await served.client.post(url, json=body, headers={"X-User": "bob"})
        assert refused.status_code == 404
        assert await snapshot(runtime) == before
