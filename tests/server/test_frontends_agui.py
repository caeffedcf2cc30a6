"""The official AG-UI client (``@ag-ui/client``'s ``HttpAgent.runAgent``) against
turnkit's AG-UI endpoint on a real hypercorn server: a run with two tools, a park
that ends a run with an interrupt answered by the next run's ``resume[]``, a
refused answer, and the declared capabilities."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from frontend_support import NodeClient, StoryModel, node_or_skip, shop_agent
from server_support import Served, serving

import turnkit
from turnkit.server.agui import ag_ui
from turnkit.stores import SqliteStore


@pytest.fixture
async def shop(tmp_path: Path) -> AsyncIterator[tuple[Served, StoryModel]]:
    node_or_skip()
    model = StoryModel()
    runtime = turnkit.Runtime(shop_agent(model), store=SqliteStore(tmp_path / "shop.db"))
    async with runtime, serving(runtime, frontends=[ag_ui()]) as served:
        try:
            yield served, model
        finally:
            model.gate.set()
            for client in NodeClient.started:
                await client.close()


async def run(served: Served, scenario: str, thread: str, user: str = "ann") -> dict[str, Any]:
    client = await NodeClient.start("agui_client.mjs", scenario, served.url, "shop", user, thread)
    return await client.result()


def texts(result: dict[str, Any]) -> list[str]:
    return [
        m["content"] for m in result["messages"] if m["role"] == "assistant" and m.get("content")
    ]


def tool_results(result: dict[str, Any]) -> dict[str, str]:
    return {m["toolCallId"]: m["content"] for m in result["messages"] if m["role"] == "tool"}


async def test_a_run_with_two_tools(shop: tuple[Served, StoryModel]) -> None:
    served, _model = shop
    result = await run(served, "two-tools", "t-tools")
    first = result["first"]
    assert first["error"] is None and first["outcome"] is None
    text = ["TEXT_MESSAGE_START", *["TEXT_MESSAGE_CONTENT"] * 3, "TEXT_MESSAGE_END"]
    call = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
    answer = ["TEXT_MESSAGE_START", *["TEXT_MESSAGE_CONTENT"] * 9, "TEXT_MESSAGE_END"]
    assert first["types"] == [
        "RUN_STARTED",
        *["STEP_STARTED", *text, *call, *call, "STEP_FINISHED"],
        *["TOOL_CALL_RESULT", "TOOL_CALL_RESULT"],
        *["STEP_STARTED", *answer, "STEP_FINISHED"],
        "RUN_FINISHED",
    ]
    assert first["result"] == "A widget weighs 2 kg and costs 3 EUR. "
    assert texts(result) == ["Let me look. ", "A widget weighs 2 kg and costs 3 EUR. "]
    assert tool_results(result) == {"call_weigh": "widget: 2 kg", "call_price": "widget: 3 EUR"}
    calls = [
        c for m in result["messages"] if m["role"] == "assistant" for c in m.get("toolCalls", [])
    ]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("weigh", '{"item": "widget"}'),
        ("price", '{"item": "widget"}'),
    ]


async def test_a_park_ends_the_run_with_an_interrupt_and_resume_answers_it(
    shop: tuple[Served, StoryModel],
) -> None:
    served, _model = shop
    result = await run(served, "approve", "t-approve")
    first, second = result["runs"]
    assert first["outcome"]["type"] == "interrupt"
    (interrupt,) = first["outcome"]["interrupts"]
    assert interrupt["id"] == "approve-refund" and interrupt["toolCallId"] == "call_refund"
    assert interrupt["message"] == "Refund A-1?"
    assert interrupt["responseSchema"] == {"type": "boolean"}
    assert second["error"] is None and second["outcome"] is None
    assert second["result"] == "Done: A-1 refunded. "
    assert tool_results(result) == {"call_refund": "A-1 refunded"}
    events = await served.runtime.store.session("t-approve").events()
    answered = [e for e in events if isinstance(e, turnkit.InputAnsweredEvent)]
    assert [(e.by, e.value) for e in answered] == [("ann", True)]


async def test_a_resume_from_someone_not_named_is_refused(shop: tuple[Served, StoryModel]) -> None:
    served, _model = shop
    result = await run(served, "refuse", "t-refuse")
    first, second = result["runs"]
    assert first["outcome"]["type"] == "interrupt"
    assert second["error"] is not None and "not_an_answerer" in second["error"]
    assert await served.runtime.store.session("t-refuse").status() == "suspended"


async def test_the_capabilities_are_what_turnkit_serves(shop: tuple[Served, StoryModel]) -> None:
    served, _model = shop
    result = await run(served, "capabilities", "t-caps")
    assert result["status"] == 200
    declared = result["capabilities"]
    assert declared["humanInTheLoop"] == {
        "supported": True,
        "approvals": True,
        "interrupts": True,
        "approveWithEdits": True,
    }
    assert declared["transport"] == {"streaming": True}
    assert sorted(t["name"] for t in declared["tools"]["items"]) == [
        "note",
        "price",
        "refund",
        "ship",
        "weigh",
    ]


async def test_a_cancel_mid_run_ends_it_with_the_cancelled_outcome(
    shop: tuple[Served, StoryModel],
) -> None:
    served, model = shop
    client = await NodeClient.start("agui_client.mjs", "stop", served.url, "shop", "ann", "t-stop")
    stopped = await client.until("stopped")
    assert stopped["status"] == 200 and len(stopped["body"]["cancelled"]) == 1
    model.gate.set()  # the model step ends; the turn stops at that boundary
    result = await client.result()
    assert result["first"]["outcome"] == {"type": "cancelled"}
    assert result["first"]["error"] is None
    assert await served.runtime.store.session("t-stop").status() == "idle"


async def test_a_decision_is_a_tool_call_interrupt_approved_with_edits(
    shop: tuple[Served, StoryModel],
) -> None:
    served, _model = shop
    result = await run(served, "ship-edit", "t-edit")
    first, second = result["runs"]
    (interrupt,) = first["outcome"]["interrupts"]
    assert interrupt["reason"] == "tool_call" and interrupt["toolCallId"] == "call_ship"
    assert interrupt["id"] == "approve-ship@call_ship"
    schema = interrupt["responseSchema"]
    assert schema["required"] == ["approved"]
    assert set(schema["properties"]) == {"approved", "editedArgs", "reason", "message"}
    proposal = interrupt["metadata"]["turnkit"]
    assert proposal["allowed"] == ["approve", "edit", "reject", "respond"]
    assert proposal["arguments"] == {"order": "A-5", "address": "Old Road 1"}
    assert second["error"] is None
    assert second["result"] == "Done: A-5 shipped to New Street 2. "
    assert tool_results(result) == {"call_ship": "A-5 shipped to New Street 2"}
    (record,) = await served.runtime.session("shop", "t-edit").answers()
    assert (record.by, record.source) == ("ann", "agui")
    assert record.decision == turnkit.Decision.edit({"order": "A-5", "address": "New Street 2"})


async def test_a_decision_rejected_over_ag_ui_tells_the_model_why(
    shop: tuple[Served, StoryModel],
) -> None:
    served, _model = shop
    result = await run(served, "ship-reject", "t-reject")
    _first, second = result["runs"]
    assert second["error"] is None
    assert "rejected it. Reason: no stock" in tool_results(result)["call_ship"]
    (record,) = await served.runtime.session("shop", "t-reject").answers()
    assert record.decision == turnkit.Decision.reject("no stock")
