"""Decisions on a proposed call in Slack, against a fake Slack speaking its wire
protocol: a button per allowed decision, approve at once, a modal for an edit (the
arguments as JSON), a reason or a response; each checked before Slack is answered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from test_slack import SESSION, Stage, staged

import turnkit
from turnkit import ActionContext, Approval, Decision, define_action
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

shipped: list[dict[str, Any]] = []


def ship_agent(**deadline: Any) -> turnkit.Agent:
    def run(data: dict[str, Any], actx: ActionContext) -> str:
        shipped.append(data)
        return f"{data['order']} shipped to {data['address']}"

    ship = define_action(
        name="ship",
        description="Ship an order.",
        input_schema={
            "type": "object",
            "properties": {
                "order": {"type": "string"},
                "address": {"type": "string", "minLength": 3},
            },
            "required": ["order", "address"],
            "additionalProperties": False,
        },
        run=run,
        approval=Approval(
            allowed=("approve", "edit", "reject", "respond"),
            prompt=lambda args: f"Ship {args['order']}?",
            **deadline,
        ),
    )

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage):
            order = last.text.split()[-1]
            arguments = {"order": order, "address": "Old Road 1"}
            return ScriptedReply(tool_calls=[tool_call("ship", arguments)])
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(text=f"Result: {last.result}")

    return turnkit.Agent(
        name="ops", model=ScriptedModel(respond=respond), instructions=".", tools=[ship]
    )


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def asked(stage: Stage, event_id: str, order: str) -> dict[str, dict[str, Any]]:
    """Ask to ship ``order``; the question's buttons by action id."""
    await stage.event(f"<@B1> ship {order}", event_id=event_id, user="U1", thread="100.1")
    await stage.settle(event_id, status="suspended")
    question = [p for p in stage.slack.of("chat.postMessage") if p.get("blocks")][-1]
    blocks = _decoded(question["blocks"])
    assert blocks[0]["text"]["text"] == f"Ship {order}?"
    proposal = blocks[1]["text"]["text"].strip("`")
    assert json.loads(proposal) == {"order": order, "address": "Old Road 1"}
    return {b["action_id"]: b for b in blocks[2]["elements"]}


async def opened_form(stage: Stage, button: dict[str, Any]) -> dict[str, Any]:
    before = len(stage.slack.of("views.open"))
    await stage.click(button, user="U1", thread="100.1")
    await eventually(lambda: len(stage.slack.of("views.open")) > before, what="a form opened")
    view: dict[str, Any] = _decoded(stage.slack.of("views.open")[-1]["view"])
    assert view["callback_id"] == "turnkit_decision"
    return view


async def test_a_decision_offers_a_button_per_allowed_kind_and_an_edit_in_a_form(
    tmp_path: Path,
) -> None:
    shipped.clear()
    async with staged(tmp_path, ship_agent()) as stage:
        buttons = await asked(stage, "Ed1", "A-5")
        assert list(buttons) == [
            "turnkit_decide_approve",
            "turnkit_decide_edit",
            "turnkit_decide_reject",
            "turnkit_decide_respond",
        ]
        view = await opened_form(stage, buttons["turnkit_decide_edit"])
        field = view["blocks"][1]["element"]
        assert json.loads(field["initial_value"]) == {"order": "A-5", "address": "Old Road 1"}
        session = stage.runtime.session("ops", SESSION)
        before = (await session.messages(), await session.events())
        for text, user, wanted in [
            ("{not json", "U1", "not JSON"),
            ('{"order": "A-5", "address": "x"}', "U1", "address"),
            ('{"order": "A-5"}', "U1", "required"),
            ('{"order": "A-5", "address": "New Street 2"}', "U2", "may not answer"),
        ]:
            refused = await stage.submit(view, text, user=user)
            errors = refused.json()
            assert errors["response_action"] == "errors", errors
            assert wanted in errors["errors"]["turnkit_answer_block"], errors
            assert (await session.messages(), await session.events()) == before
        taken = await stage.submit(view, '{"order": "A-5", "address": "New Street 2"}', user="U1")
        assert taken.status_code == 200 and taken.content == b""
        await stage.settle("Ed1")
        (record,) = await session.answers()
        assert (record.by, record.source) == ("U1", "slack")
        assert record.decision == Decision.edit({"order": "A-5", "address": "New Street 2"})
        marked = [u for u in stage.slack.of("chat.update") if u.get("ts") == "9.9"]
        assert marked and marked[-1]["text"] == "Approved with edits by <@U1>"
        assert stage.slack.of("chat.update")[-1]["text"].endswith(
            "Result: A-5 shipped to New Street 2"
        )
        again = await stage.submit(view, '{"order": "A-5", "address": "Elsewhere"}', user="U1")
        assert "already answered" in again.json()["errors"]["turnkit_answer_block"]
    assert shipped == [{"order": "A-5", "address": "New Street 2"}]


@pytest.mark.parametrize(
    ("kind", "text", "decision", "result"),
    [
        ("approve", None, Decision.approve(), "Result: A-6 shipped to Old Road 1"),
        ("reject", "out of stock", Decision.reject("out of stock"), "Reason: out of stock"),
        ("reject", "", Decision.reject(), "rejected it."),
        (
            "respond",
            "Ask for the new address first.",
            Decision.respond("Ask for the new address first."),
            "says: Ask for the new address first.",
        ),
    ],
)
async def test_approve_reject_and_respond_from_slack(
    tmp_path: Path, kind: str, text: str | None, decision: Decision, result: str
) -> None:
    shipped.clear()
    async with staged(tmp_path, ship_agent()) as stage:
        buttons = await asked(stage, "Ed2", "A-6")
        button = buttons[f"turnkit_decide_{kind}"]
        if text is None:
            await stage.click(button, user="U1", thread="100.1")
        else:
            view = await opened_form(stage, button)
            taken = await stage.submit(view, text, user="U1")
            assert taken.status_code == 200 and taken.content == b""
        await stage.settle("Ed2")
        (record,) = await stage.runtime.session("ops", SESSION).answers()
        assert (record.decision, record.by, record.source) == (decision, "U1", "slack")
        assert result in stage.slack.of("chat.update")[-1]["text"]
        outcome = {
            "approve": "Approved",
            "reject": "Rejected",
            "respond": "Answered instead",
        }[kind]
        marked = [u for u in stage.slack.of("chat.update") if u.get("ts") == "9.9"]
        assert marked and marked[-1]["text"] == f"{outcome} by <@U1>"
    assert shipped == ([{"order": "A-6", "address": "Old Road 1"}] if kind == "approve" else [])


async def test_a_decision_with_a_deadline_says_when_it_is_due(tmp_path: Path) -> None:
    agent = ship_agent(expires_in=3600, on_expiry=Decision.reject("too late"))
    async with staged(tmp_path, agent) as stage:
        await asked(stage, "Ed3", "A-7")
        question = [p for p in stage.slack.of("chat.postMessage") if p.get("blocks")][-1]
        blocks = _decoded(question["blocks"])
        request = await stage.runtime.session("ops", SESSION).pending()
        assert request is not None and request.expires_at is not None
        due = int(request.expires_at)
        assert blocks[-1] == {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"Answer by <!date^{due}^{{date_short_pretty}} at {{time}}|{due}>",
                }
            ],
        }


@pytest.mark.parametrize("callback_id", ["turnkit_answer", "turnkit_decision"])
async def test_a_submitted_form_turnkit_did_not_make_is_refused(
    tmp_path: Path, callback_id: str
) -> None:
    """Metadata that is not a form's of ours (the question's fields missing) stores
    nothing and gets 400, for an answer form and a decision form alike."""
    async with staged(tmp_path, ship_agent()) as stage:
        view = {"callback_id": callback_id, "private_metadata": json.dumps({"channel": "C1"})}
        refused = await stage.submit(view, "yes", user="U1")
        assert refused.status_code == 400
        assert refused.json() == {"error": "not a form turnkit made"}
        assert await stage.runtime.session("ops", SESSION).answers() == []
