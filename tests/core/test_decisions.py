"""Decisions on a proposed call (approve, edit, reject, respond) behind an ``Approval``,
and the record of who answered — on every store."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from eventually import eventually

import turnkit
from turnkit import (
    ActionContext,
    Answerers,
    AnswerRecord,
    Approval,
    Decision,
    Expiry,
    InboundEvent,
    InputRequest,
    InvalidAnswerError,
    ResumeAuthorizationError,
    ToolContext,
    ToolDefinitionError,
    ToolMessage,
    User,
    UserMessage,
    define_action,
    tool,
)
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount_cents": {"type": "integer", "minimum": 1},
    },
    "required": ["order_id", "amount_cents"],
    "additionalProperties": False,
}


def attested(user_id: str = "U1") -> InboundEvent:
    return InboundEvent(
        source="slack", text="refund", user=User(id=user_id, attested=True), channel_id="C1"
    )


def model_for(name: str, arguments: dict[str, Any]) -> ScriptedModel:
    """Calls ``name`` once with ``arguments``, then says what the tool returned."""

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call(name, arguments)])
        if isinstance(last, ToolMessage):
            return f"result: {last.result}"
        return "?"

    return ScriptedModel(respond=respond)


def refund_action(ran: list[dict[str, Any]], approval: Approval | None, **kw: Any) -> turnkit.Agent:
    def run(data: dict[str, Any], actx: ActionContext) -> str:
        ran.append(data)
        return f"refunded {data['amount_cents']} on {data['order_id']}"

    action = define_action(
        name="refund",
        description="Refund part of an order.",
        input_schema=REFUND_SCHEMA,
        run=run,
        approval=approval,
    )
    arguments = kw.pop("arguments", {"order_id": "A-17", "amount_cents": 1250})
    return turnkit.Agent(name="a", model=model_for("refund", arguments), tools=[action], **kw)


ALL = Approval(allowed=("approve", "edit", "reject", "respond"), answerers=Answerers.user("U-lead"))


async def parked(session: turnkit.AgentSession, **kw: Any) -> turnkit.TurnResult:
    result = await session.result(session.start("refund A-17", **kw))
    assert result.status == "suspended", result
    return result


@dataclass
class ParkedRefund:
    """A refund proposed under an ``Approval`` and parked on its decision."""

    ran: list[dict[str, Any]]  # the refunds the action carried out
    session: turnkit.AgentSession
    result: turnkit.TurnResult
    request: InputRequest

    async def resume(self, answer: Any, *, by: str = "U-lead", **kw: Any) -> str:
        """Answer the parked decision; the resumed turn's id."""
        return await self.session.resume(self.result.turn_id, self.request.id, answer, by=by, **kw)

    async def decide(self, answer: Any, *, by: str = "U-lead") -> turnkit.TurnResult:
        """Answer the parked decision and wait for the resumed turn to end."""
        return await self.session.result(await self.resume(answer, by=by))


async def parked_refund(open_runtime: Any, approval: Approval = ALL) -> ParkedRefund:
    ran: list[dict[str, Any]] = []
    rt = await open_runtime(refund_action(ran, approval))
    session = rt.session("a", "s1")
    result = await parked(session)
    assert result.request is not None
    return ParkedRefund(ran, session, result, result.request)


async def test_a_decision_request_says_what_may_be_decided_on_what(open_runtime: Any) -> None:
    refund = await parked_refund(open_runtime)
    request = refund.request
    assert refund.ran == []
    assert request.kind == "decision" and request.tool == "refund"
    assert request.id == f"approve-refund@{request.call_id}"
    assert request.decision is not None
    assert request.decision.allowed == ("approve", "edit", "reject", "respond")
    assert request.decision.arguments == {"order_id": "A-17", "amount_cents": 1250}
    assert request.decision.arguments_schema == REFUND_SCHEMA
    assert request.answerers == (Answerers.user("U-lead"),)
    assert request.asked_at is not None and time.time() - request.asked_at < 60
    # What the store keeps reads back as the same request, through JSON.
    assert await refund.session.pending() == request
    assert InputRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request


async def test_approve_runs_the_call_as_proposed(open_runtime: Any) -> None:
    refund = await parked_refund(open_runtime)
    done = await refund.session.result(await refund.resume(Decision.approve(), source="test"))
    assert done.status == "completed"
    assert refund.ran == [{"order_id": "A-17", "amount_cents": 1250}]
    assert done.text == "result: refunded 1250 on A-17"


async def test_an_edit_runs_the_call_with_the_edited_arguments(open_runtime: Any) -> None:
    refund = await parked_refund(open_runtime)
    edited = {"order_id": "A-17", "amount_cents": 1000}
    # The JSON form (what HTTP and Slack send) is taken as the object is.
    done = await refund.decide({"decision": "edit", "arguments": edited})
    assert refund.ran == [edited]
    assert done.text == "result: refunded 1000 on A-17"
    (record,) = await refund.session.answers()
    assert record.decision == Decision.edit(edited) and record.by == "U-lead"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (Decision.edit({"order_id": "A-17", "amount_cents": 0}), "amount_cents"),
        (Decision.edit({"order_id": "A-17"}), "'amount_cents' is a required property"),
        (Decision.edit({"order_id": "A-17", "amount_cents": 5, "x": 1}), "Additional properties"),
        ({"decision": "edit"}, "an edit (and only an edit) carries arguments"),
        ({"decision": "maybe"}, "a decision is an object like"),
        (True, "a decision is an object like"),
        ({"decision": "approve", "note": "x"}, "a decision takes no note"),
        ({"decision": "respond", "message": ""}, "non-empty message"),
    ],
)
async def test_a_decision_that_does_not_fit_is_refused_and_changes_nothing(
    open_runtime: Any, answer: Any, problem: str
) -> None:
    refund = await parked_refund(open_runtime)
    with pytest.raises(InvalidAnswerError, match=re.escape(problem)):
        await refund.resume(answer)
    assert await refund.session.status() == "suspended" and await refund.session.answers() == []
    # The right answer can still come.
    await refund.decide(Decision.approve())
    assert len(refund.ran) == 1


async def test_a_decision_the_request_does_not_allow_is_refused(open_runtime: Any) -> None:
    refund = await parked_refund(open_runtime, Approval(answerers=Answerers.user("U-lead")))
    assert refund.request.decision is not None
    assert refund.request.decision.allowed == ("approve", "reject")  # the default
    edit = Decision.edit({"order_id": "A-17", "amount_cents": 1})
    with pytest.raises(InvalidAnswerError, match="'edit' is not allowed here"):
        await refund.resume(edit)
    assert refund.ran == [] and await refund.session.status() == "suspended"


async def test_a_rejection_skips_the_tool_and_the_model_reads_the_reason(
    open_runtime: Any,
) -> None:
    refund = await parked_refund(open_runtime)
    done = await refund.decide(Decision.reject("the customer already got a voucher"))
    assert refund.ran == []
    tool_results = [m for m in await refund.session.messages() if isinstance(m, ToolMessage)]
    assert len(tool_results) == 1
    assert "rejected" in tool_results[0].result
    assert "the customer already got a voucher" in tool_results[0].result
    assert done.text is not None and "voucher" in done.text


async def test_a_response_is_what_the_model_reads_instead_of_the_result(
    open_runtime: Any,
) -> None:
    refund = await parked_refund(open_runtime)
    await refund.decide(Decision.respond("Offer a 10% voucher instead."))
    assert refund.ran == []
    (message,) = [m for m in await refund.session.messages() if isinstance(m, ToolMessage)]
    assert "Offer a 10% voucher instead." in message.result and not message.is_error


async def test_two_proposed_calls_of_one_step_are_decided_one_by_one(open_runtime: Any) -> None:
    ran: list[dict[str, Any]] = []

    def run(data: dict[str, Any], actx: ActionContext) -> str:
        ran.append(data)
        return f"refunded {data['order_id']}"

    refund = define_action(
        name="refund",
        description="Refund an order.",
        input_schema=REFUND_SCHEMA,
        run=run,
        approval=Approval(allowed=("approve", "reject")),
    )
    calls = [tool_call("refund", {"order_id": order, "amount_cents": 100}) for order in ("A", "B")]
    model = ScriptedModel([ScriptedReply(tool_calls=calls), "Both decided."])
    agent = turnkit.Agent(name="a", model=model, tools=[refund], max_parallel_tools=2)
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    result = await parked(session)
    first, second = result.requests
    assert first.id != second.id and {first.call_id, second.call_id} == {"call_1", "call_2"}
    assert [r.decision.arguments["order_id"] for r in result.requests if r.decision] == ["A", "B"]
    await session.resume(result.turn_id, second.id, Decision.reject("not this one"))
    assert await session.status() == "suspended" and ran == []
    done = await session.result(await session.resume(result.turn_id, first.id, Decision.approve()))
    assert done.text == "Both decided." and ran == [{"order_id": "A", "amount_cents": 100}]
    results = [m.result for m in await session.messages() if isinstance(m, ToolMessage)]
    assert results[0] == "refunded A" and "not this one" in results[1]
    assert [r.decision for r in await session.answers()] == [
        Decision.reject("not this one"),
        Decision.approve(),
    ]


async def test_each_decision_is_checked_against_the_answerers(open_runtime: Any) -> None:
    refund = await parked_refund(open_runtime)
    for decision in (Decision.approve(), Decision.reject("no"), Decision.respond("hm")):
        with pytest.raises(ResumeAuthorizationError, match="user U-lead"):
            await refund.resume(decision, by="U-intern")
    assert await refund.session.answers() == [] and refund.ran == []


async def test_a_policy_answerer_decides_with_a_grant(open_runtime: Any) -> None:
    async def authorize(check: turnkit.AnswerCheck) -> bool:
        return check.policy == "leads" and check.by == "ana"

    ran: list[dict[str, Any]] = []
    approval = Approval(allowed=("approve", "edit"), answerers=Answerers.policy("leads"))
    rt = await open_runtime(refund_action(ran, approval, authorize_answer=authorize))
    session = rt.session("a", "s1")
    result = await parked(session)
    assert result.request is not None
    edit = Decision.edit({"order_id": "A-17", "amount_cents": 99})
    with pytest.raises(ResumeAuthorizationError):
        await session.resume(result.turn_id, result.request.id, edit, by="ana")
    resume = turnkit.ResumeRequest(
        turn_id=result.turn_id, input_id=result.request.id, value=edit, by="ana"
    )
    grant = await turnkit.grant_answer(session, resume)
    await session.result(
        await session.resume(result.turn_id, result.request.id, edit, by="ana", granted=grant)
    )
    assert ran == [{"order_id": "A-17", "amount_cents": 99}]


async def test_the_default_decider_is_the_attested_speaker(open_runtime: Any) -> None:
    ran: list[dict[str, Any]] = []
    rt = await open_runtime(refund_action(ran, Approval()))
    session = rt.session("a", "s1")
    result = await parked(session, event=attested("U7"))
    assert result.request is not None and result.request.answerers == (Answerers.user("U7"),)


async def test_when_says_which_calls_need_a_decision(open_runtime: Any) -> None:
    ran: list[dict[str, Any]] = []
    approval = Approval(when=lambda args: args["amount_cents"] > 5000)
    small = {"order_id": "A-1", "amount_cents": 300}
    rt = await open_runtime(refund_action(ran, approval, arguments=small))
    session = rt.session("a", "s1")
    done = await session.result(session.start("refund"))
    assert done.status == "completed" and ran == [small]


async def test_invalid_proposals_reach_the_model_without_asking_anyone(
    open_runtime: Any,
) -> None:
    ran: list[dict[str, Any]] = []
    bad = {"order_id": "A-1", "amount_cents": "lots"}
    rt = await open_runtime(refund_action(ran, ALL, arguments=bad))
    session = rt.session("a", "s1")
    done = await session.result(session.start("refund"))
    assert done.status == "completed" and ran == []
    assert done.text is not None and "amount_cents" in done.text


async def test_a_typed_async_tool_takes_an_approval_and_validates_the_edit(
    open_runtime: Any,
) -> None:
    sent: list[tuple[str, str]] = []

    @tool(approval=Approval(allowed=("approve", "edit"), answerers=Answerers.user("U1")))
    async def email(to: str, body: str, ctx: ToolContext) -> str:
        """Send an e-mail."""
        sent.append((to, body))
        return f"sent to {to}"

    agent = turnkit.Agent(
        name="a", model=model_for("email", {"to": "x@example.com", "body": "hi"}), tools=[email]
    )
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    result = await parked(session)
    assert result.request is not None and result.request.decision is not None
    assert result.request.decision.arguments_schema == email.spec.input_schema
    with pytest.raises(InvalidAnswerError, match="body"):
        await session.resume(
            result.turn_id, result.request.id, Decision.edit({"to": "y@example.com"}), by="U1"
        )
    edit = Decision.edit({"to": "y@example.com", "body": "hello"})
    await session.result(await session.resume(result.turn_id, result.request.id, edit, by="U1"))
    assert sent == [("y@example.com", "hello")]


async def test_any_tool_takes_an_approval_after_it_was_made(open_runtime: Any) -> None:
    ran: list[dict[str, Any]] = []
    plain = refund_action(ran, None).tools[0]
    assert plain.action is not None  # an MCP server could serve it
    gated = plain.with_approval(Approval(allowed=("approve", "reject")))
    assert gated.action is None and gated.spec == plain.spec
    agent = turnkit.Agent(
        name="a", model=model_for("refund", {"order_id": "A-1", "amount_cents": 5}), tools=[gated]
    )
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    result = await parked(session)
    assert result.request is not None and result.request.kind == "decision" and ran == []
    await session.result(
        await session.resume(result.turn_id, result.request.id, Decision.approve())
    )
    assert ran == [{"order_id": "A-1", "amount_cents": 5}]
    with pytest.raises(ToolDefinitionError, match=r"takes a turnkit\.Approval"):
        plain.with_approval("yes")  # type: ignore[arg-type]


async def test_a_decision_nobody_takes_in_time_is_taken_at_its_deadline(
    open_runtime: Any,
) -> None:
    ran: list[dict[str, Any]] = []
    approval = Approval(
        allowed=("approve", "reject"),
        expires_in=timedelta(hours=1),
        on_expiry=Decision.reject("nobody decided in time"),
        remind_every=600,
    )
    rt = await open_runtime(refund_action(ran, approval))
    session = rt.session("a", "s1")
    result = await parked(session)
    request = result.request
    assert request is not None and request.expires_at is not None and request.asked_at
    assert request.expires_at - request.asked_at == pytest.approx(3600)
    assert request.remind_at == pytest.approx(request.asked_at + 600)
    assert request.on_expiry == Expiry(
        action="answer", value={"decision": "reject", "reason": "nobody decided in time"}
    )
    assert await rt.timers.fire_due(rt.store, now=request.expires_at + 1) >= 1

    async def idle() -> bool:
        return await session.status() == "idle"

    await eventually(idle, what="the session idle after the expiry", timeout=20)
    done = await session.result(result.turn_id)
    assert done.status == "completed" and ran == []
    assert done.text is not None and "nobody decided in time" in done.text
    (record,) = await session.answers()
    assert record.by == "deadline"
    assert record.decision == Decision.reject("nobody decided in time")


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"expires_in": 60}, "needs on_expiry"),
        ({"on_expiry": "cancel"}, "needs expires_in"),
        ({"expires_in": 0, "on_expiry": "cancel"}, "more than zero"),
        ({"expires_in": 60, "on_expiry": Decision.respond("x")}, "cannot be taken at"),
        (
            {"allowed": ("approve", "edit"), "expires_in": 60, "on_expiry": Decision.edit({})},
            "an edit needs a person",
        ),
        ({"remind_every": "often"}, "remind_every must be"),
        ({"allowed": ("approve", "maybe")}, "allowed takes one or more of"),
        ({"allowed": ()}, "allowed takes one or more of"),
        ({"allowed": "approve"}, "must be a tuple"),
        ({"when": 3}, "Approval.when must be callable"),
        ({"answerers": "U1"}, "answerers must be"),
    ],
)
def test_an_approval_that_makes_no_sense_is_refused_when_declared(
    kwargs: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ToolDefinitionError, match=problem):
        Approval(**kwargs)


def test_a_plain_def_tool_that_writes_through_the_store_cannot_wait_for_a_person() -> None:
    def note(text: str, ctx: ToolContext) -> str:
        """Write a note."""
        return text

    with pytest.raises(ToolDefinitionError, match="async def"):
        tool(approval=Approval())(note)


def test_a_request_stored_before_decisions_existed_still_loads() -> None:
    old = {
        "id": "approve",
        "prompt": "Refund?",
        "turn_id": "t1",
        "call_id": "c1",
        "tool": "refund",
        "schema": None,
        "answerers": [{"kind": "user", "user_id": "U1"}],
    }
    request = InputRequest.from_dict(old)
    assert (request.kind, request.decision, request.asked_at) == ("input", None, None)


def test_a_stored_request_of_an_unknown_kind_is_refused() -> None:
    with pytest.raises(turnkit.MessageDecodeError, match="unknown kind"):
        InputRequest.from_dict(
            {"id": "a", "prompt": "p", "turn_id": "t", "call_id": "c", "tool": "x", "kind": "vote"}
        )


async def test_every_answer_is_recorded_with_who_when_where_and_what(
    open_runtime: Any, make_store: Any
) -> None:
    """Decided in one runtime, read back from the store by another (a new process)."""
    ran: list[dict[str, Any]] = []
    agent = refund_action(ran, ALL)
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    result = await parked(session)
    assert result.request is not None
    before = time.time()
    edit = Decision.edit({"order_id": "A-17", "amount_cents": 700})
    await session.result(
        await session.resume(result.turn_id, result.request.id, edit, by="U-lead", source="slack")
    )
    other = await open_runtime(agent, store=make_store())
    (record,) = await other.session("a", "s1").answers()
    assert isinstance(record, AnswerRecord)
    assert (record.turn_id, record.input_id, record.call_id, record.tool, record.kind) == (
        result.turn_id,
        result.request.id,
        result.request.call_id,
        "refund",
        "decision",
    )
    assert (record.by, record.source) == ("U-lead", "slack")
    assert record.at is not None and before - 1 <= record.at <= time.time() + 1
    assert record.decision == edit and record.value == edit.to_dict()
    assert record.describe() == (
        "refund: approved with edits {'order_id': 'A-17', 'amount_cents': 700} by U-lead via slack"
    )
    assert await other.session("a", "s1").answers(turn_id="other") == []


async def test_an_ordinary_answer_is_recorded_too(open_runtime: Any) -> None:
    @tool
    async def wipe(disk: str, ctx: ToolContext) -> str:
        """Wipe a disk once someone says yes."""
        yes = await ctx.request_input("wipe", f"Wipe {disk}?", schema={"type": "boolean"})
        return "wiped" if yes else "kept"

    agent = turnkit.Agent(name="a", model=model_for("wipe", {"disk": "sdb"}), tools=[wipe])
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    result = await parked(session)
    await session.result(await session.resume(result.turn_id, "wipe", False, by="bo"))
    (record,) = await session.answers()
    assert (record.kind, record.decision, record.value, record.source) == (
        "input",
        None,
        False,
        None,
    )
    assert record.describe() == "wipe: answered False by bo"
