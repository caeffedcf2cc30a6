"""Human in the loop: parking a turn, resuming it, and who may answer — on every store."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from suite_paths import CHILDREN

import turnkit
from turnkit import (
    AnswerCheck,
    Answerer,
    Answerers,
    Grant,
    InboundEvent,
    InputRequest,
    ResumeAuthorizationError,
    ResumeConflictError,
    ResumeRequest,
    ToolContext,
    ToolMessage,
    User,
    UserMessage,
    grant_answer,
    tool,
)
from turnkit._runtime.approvals import GrantSealer
from turnkit.stores import parked_turn
from turnkit.testing import CrashingStore, RecordingSink, ScriptedModel, ScriptedReply, tool_call

APPROVAL = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}


@dataclass
class Ledger:
    """What the refund tool did: every run up to request_input, every refund after it."""

    asked: list[str] = field(default_factory=list)
    refunded: list[str] = field(default_factory=list)


def refund_agent(
    ledger: Ledger,
    *,
    answerers: Answerer | list[Answerer] | None = None,
    schema: dict[str, Any] | None = APPROVAL,
    input_id: str = "approve",
    authorize: Any = None,
) -> turnkit.Agent:
    @tool
    async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order once a person approves it."""
        ledger.asked.append(order_id)  # before the question: runs again on resume
        answer = await ctx.request_input(
            input_id, f"Refund order {order_id}?", schema=schema, answerers=answerers
        )
        if not answer["approved"]:
            return {"refunded": False}
        ledger.refunded.append(order_id)  # after it: runs once
        return {"refunded": True}

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("refund", {"order_id": last.text})])
        if isinstance(last, ToolMessage):
            return f"done: {last.result}"
        return "?"

    return turnkit.Agent(
        name="a",
        model=ScriptedModel(respond=respond),
        tools=[refund],
        authorize_answer=authorize,
    )


def attested(user_id: str = "U1") -> InboundEvent:
    return InboundEvent(
        source="slack",
        text="refund",
        user=User(id=user_id, attested=True),
        channel_id="C1",
        raw={"signed": "payload", "secret": "x"},
    )


async def stored_state(session: turnkit.AgentSession, turn_id: str) -> Any:
    """Everything a refused resume must leave exactly as it was."""
    store = session._store
    snap = await store.load(turn_id)
    parked = await parked_turn(store)
    return (
        [m.to_dict() for m in snap.messages],
        snap.steps,
        snap.turn,
        parked,
        [e.to_dict() for e in await store.events()],
        await store.status(),
    )


async def park(session: turnkit.AgentSession, text: str = "o-1", **kw: Any) -> turnkit.TurnResult:
    result = await session.result(session.start(text, **kw))
    assert result.status == "suspended", result
    return result


# -- parking -----------------------------------------------------------------------


async def test_a_park_writes_one_checkpoint_and_announces_the_request(
    open_runtime: Any, sink: RecordingSink
) -> None:
    ledger = Ledger()
    rt = await open_runtime(refund_agent(ledger, answerers=Answerers.user("U1")))
    session = rt.session("a", "s1")
    result = await park(session, event=attested())
    request = result.request
    assert isinstance(request, InputRequest)
    assert (request.id, request.prompt, request.tool) == ("approve", "Refund order o-1?", "refund")
    assert request.answerers == (Answerers.user("U1"),) and request.schema == APPROVAL
    assert await session.status() == "suspended"
    assert await session.pending() == request
    assert sink.types()[-1] == "input.requested"
    parked = await parked_turn(session._store)
    assert parked is not None and parked.pending is not None
    assert parked.pending.call_id == request.call_id
    assert parked.pending.opening_text == "o-1"
    assert parked.pending.request == request
    assert parked.pending.event is not None
    assert parked.pending.event.user == User(id="U1", attested=True)
    assert parked.pending.event.raw is None  # the platform payload is never stored
    logged = [e.type for e in await session.events()]
    assert logged.count("input.requested") == 1
    # result() read back from the store, as another process would see it:
    assert turnkit.TurnResult(
        turn_id=result.turn_id, status="suspended", request=request
    ) == await rt.session("a", "s1").result(result.turn_id)


async def test_session_turn_raises_turn_suspended_error_with_the_request(
    open_runtime: Any,
) -> None:
    rt = await open_runtime(refund_agent(Ledger()))
    with pytest.raises(turnkit.TurnSuspendedError) as caught:
        await rt.session("a", "s1").turn("o-1")
    assert caught.value.request.id == "approve"


async def test_request_input_in_a_plain_def_tool_fails_the_turn_at_once(
    open_runtime: Any,
) -> None:
    @tool
    def sync_refund(ctx: ToolContext) -> str:
        """Wrongly asks from a local tool."""
        ctx.request_input("approve", "ok?")
        return "unreachable"

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("sync_refund")])])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[sync_refund]))
    session = rt.session("a", "s1")
    result = await session.result(session.start("go"))
    assert result.status == "failed" and "async def" in (result.error or "")
    assert await session.pending() is None and await session.status() == "idle"


async def test_an_invalid_schema_fails_the_turn_naming_it(open_runtime: Any) -> None:
    rt = await open_runtime(refund_agent(Ledger(), schema={"type": "no-such-type"}))
    session = rt.session("a", "s1")
    result = await session.result(session.start("o-1"))
    assert result.status == "failed" and "not a valid JSON Schema" in (result.error or "")


# -- resuming ----------------------------------------------------------------------


async def test_resume_stores_the_answer_and_replays_the_tool_from_the_top(
    open_runtime: Any, sink: RecordingSink
) -> None:
    ledger = Ledger()
    rt = await open_runtime(refund_agent(ledger))
    session = rt.session("a", "s1")
    parked = await park(session)
    tid = await session.resume(parked.turn_id, "approve", {"approved": True})
    result = await session.result(tid)
    assert result.status == "completed" and result.text == "done: {'refunded': True}"
    assert ledger.asked == ["o-1", "o-1"] and ledger.refunded == ["o-1"]
    steps = (await session._store.load(tid)).steps
    assert steps[f"input:{tid}:approve"] == {"value": {"approved": True}, "by": None}
    assert await session.status() == "idle" and await session.pending() is None
    assert [m.role for m in await session.messages()] == ["user", "assistant", "tool", "assistant"]


async def test_who_answered_is_logged_once_as_input_answered(
    open_runtime: Any, sink: RecordingSink
) -> None:
    rt = await open_runtime(refund_agent(Ledger(), answerers=Answerers.user("U1")))
    session = rt.session("a", "s1")
    parked = await park(session, event=attested())
    assert parked.request is not None
    stream = session.observe(
        await session.resume(parked.turn_id, "approve", {"approved": True}, by="U1")
    )
    seen = [e async for e in stream]
    logged = await session.events()
    answers = [e for e in logged if isinstance(e, turnkit.InputAnsweredEvent)]
    assert len(answers) == 1
    answered = answers[0]
    assert (answered.turn_id, answered.input_id, answered.by) == (parked.turn_id, "approve", "U1")
    assert answered.value == {"approved": True}
    assert answered.call_id == parked.request.call_id
    types = [e.type for e in logged]
    # Numbered in the log right after the question, before the result it led to.
    assert types[types.index("input.requested") + 1] == "input.answered"
    assert types.index("input.answered") < types.index("action.completed")
    assert [e.seq for e in logged] == list(range(1, len(logged) + 1))
    # The resumed delivery told its observers first, with the logged number.
    assert seen[0].type == "input.answered" and seen[0].seq == answered.seq
    # Stamped when it happened; the store gives the time back as it was logged.
    assert answered.at is not None and seen[0].at == answered.at
    assert all(e.at is not None for e in logged)
    assert sink.types().count("input.answered") == 1
    wire = answered.to_dict()
    assert wire["type"] == "input.answered" and wire["by"] == "U1"
    assert turnkit.event_from_dict(json.loads(json.dumps(wire))) == answered


async def test_input_answered_names_nobody_when_the_resume_named_nobody(
    open_runtime: Any,
) -> None:
    rt = await open_runtime(refund_agent(Ledger()))
    session = rt.session("a", "s1")
    parked = await park(session)
    await session.result(await session.resume(parked.turn_id, "approve", {"approved": False}))
    [answered] = [e for e in await session.events() if e.type == "input.answered"]
    assert isinstance(answered, turnkit.InputAnsweredEvent)
    assert answered.by is None and answered.value == {"approved": False}


async def test_a_refused_resume_logs_no_answer(open_runtime: Any) -> None:
    rt = await open_runtime(refund_agent(Ledger(), answerers=Answerers.user("U1")))
    session = rt.session("a", "s1")
    parked = await park(session, event=attested())
    with pytest.raises(ResumeAuthorizationError):
        await session.resume(parked.turn_id, "approve", {"approved": True}, by="U2")
    with pytest.raises(turnkit.InvalidAnswerError):
        await session.resume(parked.turn_id, "approve", {"approved": "yes"}, by="U1")
    assert "input.answered" not in [e.type for e in await session.events()]


async def test_a_new_runtime_on_the_same_store_resumes_a_parked_turn(
    make_store: Any, sink: RecordingSink
) -> None:
    ledger = Ledger()
    async with turnkit.Runtime(refund_agent(ledger), store=make_store(), sink=sink) as rt:
        parked = await park(rt.session("a", "s1"))
    # Nothing about the park lives in memory: a fresh runtime (a new store object for
    # the durable stores) finds it and resumes it.
    async with turnkit.Runtime(refund_agent(ledger), store=make_store(), sink=sink) as rt:
        session = rt.session("a", "s1")
        assert (await session.pending()) == parked.request
        tid = await session.resume(parked.turn_id, "approve", {"approved": False})
        assert (await session.result(tid)).text == "done: {'refunded': False}"
    assert ledger.refunded == []


async def test_an_answer_that_breaks_the_schema_is_refused_and_not_stored(
    open_runtime: Any,
) -> None:
    rt = await open_runtime(refund_agent(Ledger()))
    session = rt.session("a", "s1")
    parked = await park(session)
    before = await stored_state(session, parked.turn_id)
    with pytest.raises(turnkit.InvalidAnswerError, match="approved"):
        await session.resume(parked.turn_id, "approve", {"approved": "yes"})
    with pytest.raises(turnkit.InvalidAnswerError, match="is not JSON"):
        await session.resume(parked.turn_id, "approve", {"approved": object()})
    assert await stored_state(session, parked.turn_id) == before
    assert await session.status() == "suspended"
    tid = await session.resume(parked.turn_id, "approve", {"approved": True})
    assert (await session.result(tid)).status == "completed"


async def test_answers_never_carry_over_to_a_later_turn(open_runtime: Any) -> None:
    ledger = Ledger()
    rt = await open_runtime(refund_agent(ledger))
    session = rt.session("a", "s1")
    first = await park(session, "o-1")
    await session.result(await session.resume(first.turn_id, "approve", {"approved": True}))
    second = await park(session, "o-2")  # the same input id asks again
    assert second.request is not None and second.request.turn_id == second.turn_id
    assert ledger.refunded == ["o-1"]


@pytest.mark.parametrize("wrong", ["turn", "input", "not-parked"])
async def test_conflicting_resumes_are_refused_and_change_nothing(
    open_runtime: Any, wrong: str
) -> None:
    rt = await open_runtime(refund_agent(Ledger()))
    session = rt.session("a", "s1")
    parked = await park(session)
    if wrong == "not-parked":
        await session.result(await session.resume(parked.turn_id, "approve", {"approved": True}))
    before = await stored_state(session, parked.turn_id)
    turn_id = "other-turn" if wrong == "turn" else parked.turn_id
    input_id = "other-input" if wrong == "input" else "approve"
    with pytest.raises(ResumeConflictError):
        await session.resume(turn_id, input_id, {"approved": True})
    assert await stored_state(session, parked.turn_id) == before


async def test_one_park_at_a_time_and_redelivery_re_announces(
    open_runtime: Any, make_store: Any, sink: RecordingSink
) -> None:
    rt = await open_runtime(refund_agent(Ledger()))
    session = rt.session("a", "s1")
    parked = await park(session)
    with pytest.raises(turnkit.SessionSuspendedError, match="waiting for input"):
        session.start("another")
    before = await stored_state(session, parked.turn_id)
    # Redelivering the parked turn itself is fine: it says again what it waits for.
    sink.events.clear()
    again = await session.result(session.start("o-1", turn_id=parked.turn_id))
    assert again.status == "suspended" and again.request == parked.request
    assert sink.types() == ["input.requested"]
    assert await stored_state(session, parked.turn_id) == before  # no second checkpoint


async def test_another_runtime_cannot_open_a_turn_on_a_parked_session(
    make_store: Any, store_kind: str
) -> None:
    if store_kind == "memory":
        pytest.skip("two runtimes share one MemoryStore object only within a process")
    async with turnkit.Runtime(refund_agent(Ledger()), store=make_store()) as rt:
        parked = await park(rt.session("a", "s1"))
    async with turnkit.Runtime(refund_agent(Ledger()), store=make_store()) as rt:
        session = rt.session("a", "s1")
        before = await stored_state(session, parked.turn_id)
        with pytest.raises(turnkit.SessionSuspendedError):
            await session.result(session.start("another"))
        assert await stored_state(session, parked.turn_id) == before


# -- who may answer --------------------------------------------------------------------


async def test_a_user_answerer_admits_only_that_verified_user(open_runtime: Any) -> None:
    rt = await open_runtime(refund_agent(Ledger(), answerers=Answerers.user("U1")))
    session = rt.session("a", "s1")
    parked = await park(session)
    before = await stored_state(session, parked.turn_id)
    for by in (None, "U2"):
        with pytest.raises(ResumeAuthorizationError, match="only by user U1"):
            await session.resume(parked.turn_id, "approve", {"approved": True}, by=by)
    assert await stored_state(session, parked.turn_id) == before
    tid = await session.resume(parked.turn_id, "approve", {"approved": True}, by="U1")
    assert (await session.result(tid)).status == "completed"
    steps = (await session._store.load(tid)).steps
    assert steps[f"input:{tid}:approve"]["by"] == "U1"


async def test_a_policy_answerer_needs_a_grant_for_exactly_its_policy_and_scope(
    open_runtime: Any,
) -> None:
    checks: list[AnswerCheck] = []

    async def authorize(check: AnswerCheck) -> bool:
        checks.append(check)
        return check.by == "ops-lead" and check.principal == {"role": "lead"}

    policy = Answerers.policy("operator", scope="mailbox:scout")
    agent = refund_agent(Ledger(), answerers=policy, authorize=authorize)
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    parked = await park(session)
    tid = parked.turn_id
    before = await stored_state(session, tid)
    # `by` alone never answers a policy.
    with pytest.raises(ResumeAuthorizationError, match="policy operator"):
        await session.resume(tid, "approve", {"approved": True}, by="ops-lead")
    # A grant for another scope (sealed by this runtime, so only the scope is wrong).
    request = await session.pending()
    assert request is not None
    other = rt._grants.issue(
        session_id="s1",
        generation=0,
        request=request,
        answerer=Answerers.policy("operator", scope="mailbox:other"),
        by="ops-lead",
    )
    with pytest.raises(ResumeAuthorizationError):
        await session.resume(tid, "approve", {"approved": True}, by="ops-lead", granted=other)
    # authorize_answer saying no makes no grant.
    resume = ResumeRequest(turn_id=tid, input_id="approve", value={"approved": True}, by="x")
    with pytest.raises(ResumeAuthorizationError, match="did not admit"):
        await grant_answer(session, resume)
    assert await stored_state(session, tid) == before
    resume = ResumeRequest(
        turn_id=tid,
        input_id="approve",
        value={"approved": True},
        by="ops-lead",
        principal={"role": "lead"},
    )
    grant = await grant_answer(session, resume)
    assert checks[-1] == AnswerCheck(
        policy="operator", scope="mailbox:scout", by="ops-lead", principal={"role": "lead"}
    )
    await session.resume(tid, "approve", {"approved": True}, by="ops-lead", granted=grant)
    assert (await session.result(tid)).status == "completed"


async def test_a_grant_never_answers_a_user_answerer(open_runtime: Any) -> None:
    rt = await open_runtime(refund_agent(Ledger(), answerers=Answerers.user("U1")))
    session = rt.session("a", "s1")
    parked = await park(session)
    assert parked.request is not None
    sealed = rt._grants.issue(
        session_id="s1",
        generation=0,
        request=parked.request,
        answerer=Answerers.policy("operator"),
        by="U2",
    )
    with pytest.raises(ResumeAuthorizationError):
        await session.resume(parked.turn_id, "approve", {"approved": True}, by="U2", granted=sealed)
    resume = ResumeRequest(turn_id=parked.turn_id, input_id="approve", value={}, by="U2")
    with pytest.raises(ResumeAuthorizationError, match="names no policy answerer"):
        await grant_answer(session, resume, authorize_answer=_always_yes)


async def _always_yes(check: AnswerCheck) -> bool:
    return True


async def test_a_hand_made_or_altered_grant_is_refused(open_runtime: Any) -> None:
    policy = Answerers.policy("operator")
    rt = await open_runtime(refund_agent(Ledger(), answerers=policy, authorize=_always_yes))
    session = rt.session("a", "s1")
    parked = await park(session)
    tid = parked.turn_id
    forged = Grant(
        session_id="s1",
        turn_id=tid,
        input_id="approve",
        generation=0,
        policy="operator",
        scope=None,
        by="me",
    )
    with pytest.raises(ResumeAuthorizationError, match="not issued by grant_answer"):
        await session.resume(tid, "approve", {"approved": True}, by="me", granted=forged)
    real = await grant_answer(
        session, ResumeRequest(turn_id=tid, input_id="approve", value=None, by="me")
    )
    altered = Grant(
        session_id="s1",
        turn_id=tid,
        input_id="approve",
        generation=0,
        policy="operator",
        scope=None,
        by="someone-else",
        seal=real.seal,
    )
    with pytest.raises(ResumeAuthorizationError, match="not issued by grant_answer"):
        await session.resume(tid, "approve", {"approved": True}, by="someone-else", granted=altered)
    # The genuine grant is bound to its `by`.
    with pytest.raises(ResumeAuthorizationError):
        await session.resume(tid, "approve", {"approved": True}, by="other", granted=real)
    await session.resume(tid, "approve", {"approved": True}, by="me", granted=real)
    assert (await session.result(tid)).status == "completed"


class _EqualsAnything(str):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


async def test_a_grant_is_checked_by_its_plain_values_never_by_its_own_code(
    open_runtime: Any,
) -> None:
    """A subclass that hands over a genuine grant's payload while claiming another
    answerer, or a field that compares equal to anything, gets nowhere."""
    policy = Answerers.policy("operator")
    rt = await open_runtime(refund_agent(Ledger(), answerers=policy, authorize=_always_yes))
    session = rt.session("a", "s1")
    tid = (await park(session)).turn_id
    real = await grant_answer(
        session, ResumeRequest(turn_id=tid, input_id="approve", value=None, by="me")
    )
    genuine = {f.name: getattr(real, f.name) for f in dataclasses.fields(real)}

    class Borrowing(Grant):
        def _payload(self) -> bytes:  # what the grant once was sealed over
            data = {k: v for k, v in genuine.items() if k != "seal"}
            return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    borrowing = Borrowing(**{**genuine, "by": "mallory"})
    lying = dataclasses.replace(real, by=_EqualsAnything("me"))
    before = await stored_state(session, tid)
    for fake in (borrowing, lying):
        with pytest.raises(ResumeAuthorizationError, match="not issued by grant_answer"):
            await session.resume(tid, "approve", {"approved": True}, by="mallory", granted=fake)
    assert await stored_state(session, tid) == before
    await session.resume(tid, "approve", {"approved": True}, by="me", granted=real)
    assert (await session.result(tid)).status == "completed"


async def test_a_grant_from_before_a_reset_answers_nothing_after_it(open_runtime: Any) -> None:
    """The same turn id parks on the same input id in generation 1: the grant issued
    in generation 0 is refused, a fresh one answers."""
    ledger = Ledger()
    policy = Answerers.policy("operator")
    rt = await open_runtime(refund_agent(ledger, answerers=policy, authorize=_always_yes))
    session = rt.session("a", "s1")
    await park(session, "o-1", turn_id="t1")
    resume = ResumeRequest(turn_id="t1", input_id="approve", value=None, by="me")
    old = await grant_answer(session, resume)
    assert old.generation == 0
    await session.reset()
    await park(session, "o-2", turn_id="t1")
    before = await stored_state(session, "t1")
    with pytest.raises(ResumeAuthorizationError, match="generation 0 of session s1; the session"):
        await session.resume("t1", "approve", {"approved": True}, by="me", granted=old)
    assert await stored_state(session, "t1") == before
    fresh = await grant_answer(session, resume)
    assert fresh.generation == 1
    await session.resume("t1", "approve", {"approved": True}, by="me", granted=fresh)
    assert (await session.result("t1")).status == "completed"
    assert ledger.refunded == ["o-2"]


async def test_only_grant_answer_makes_grants(open_runtime: Any) -> None:
    """Nothing public hands out the sealer: no ``runtime.grants``, nothing reachable
    from the runtime's or a session's public attributes, nothing exported."""
    rt = await open_runtime(refund_agent(Ledger()))
    session = rt.session("a", "s1")
    assert not hasattr(rt, "grants")
    reachable = [
        getattr(owner, name)
        for owner in (rt, session, rt.children)
        for name in dir(owner)
        if not name.startswith("_")
    ]
    assert not any(isinstance(value, GrantSealer) for value in reachable)
    assert "GrantSealer" not in turnkit.__all__ and not hasattr(turnkit, "GrantSealer")


async def test_authorize_answer_raising_makes_no_grant_and_the_answer_can_be_retried(
    open_runtime: Any,
) -> None:
    calls = 0

    async def flaky(check: AnswerCheck) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("directory service down")
        return True

    rt = await open_runtime(
        refund_agent(Ledger(), answerers=Answerers.policy("operator"), authorize=flaky)
    )
    session = rt.session("a", "s1")
    parked = await park(session)
    before = await stored_state(session, parked.turn_id)
    resume = ResumeRequest(turn_id=parked.turn_id, input_id="approve", value=None, by="op")
    with pytest.raises(ConnectionError):
        await grant_answer(session, resume)
    assert await stored_state(session, parked.turn_id) == before
    grant = await grant_answer(session, resume)
    await session.resume(parked.turn_id, "approve", {"approved": True}, by="op", granted=grant)
    assert (await session.result(parked.turn_id)).status == "completed"


async def test_the_default_answerer_is_the_attested_speaker(open_runtime: Any) -> None:
    rt = await open_runtime(refund_agent(Ledger()))
    session = rt.session("a", "s1")
    parked = await park(session, event=attested("U7"))
    assert parked.request is not None and parked.request.answerers == (Answerers.user("U7"),)
    with pytest.raises(ResumeAuthorizationError):
        await session.resume(parked.turn_id, "approve", {"approved": True}, by="U8")
    await session.resume(parked.turn_id, "approve", {"approved": True}, by="U7")
    assert (await session.result(parked.turn_id)).status == "completed"


async def test_an_unattested_speaker_cannot_park_without_a_named_answerer(
    open_runtime: Any,
) -> None:
    rt = await open_runtime(refund_agent(Ledger()))
    session = rt.session("a", "s1")
    event = InboundEvent(source="web", text="refund", user=User(id="U1", attested=False))
    result = await session.result(session.start("o-1", event=event))
    assert result.status == "failed" and "name one with answerers=" in (result.error or "")
    assert await session.pending() is None and await session.status() == "idle"


async def test_a_turn_without_an_inbound_event_parks_for_anyone(open_runtime: Any) -> None:
    rt = await open_runtime(refund_agent(Ledger()))
    session = rt.session("a", "s1")
    parked = await park(session)
    assert parked.request is not None and parked.request.answerers == ()
    await session.resume(parked.turn_id, "approve", {"approved": True})
    assert (await session.result(parked.turn_id)).status == "completed"


# -- crashes and processes --------------------------------------------------------------


async def test_a_crash_in_the_resumed_replay_recovers_without_asking_again(
    make_store: Any, store_kind: str
) -> None:
    class Outage(Exception):
        pass

    def outage() -> None:
        raise Outage("store went away")

    ledger = Ledger()
    async with turnkit.Runtime(refund_agent(ledger), store=make_store()) as rt:
        parked = await park(rt.session("a", "s1"))
    # Commit 1 stores the answer; commit 2 (the refund's result) is interrupted.
    crashing = CrashingStore(make_store(), crash_at=2, when="before", on_crash=outage)
    async with turnkit.Runtime(refund_agent(ledger), store=crashing) as rt:
        session = rt.session("a", "s1")
        await session.resume(parked.turn_id, "approve", {"approved": True})
        with pytest.raises(Outage):
            await session.result(parked.turn_id)
    async with turnkit.Runtime(refund_agent(ledger), store=make_store()) as rt:
        recovered = await rt.recover()
        session = rt.session("a", "s1")
        assert [r.status for r in recovered] == ["completed"]
        events = [e.type for e in await session.events()]
    assert events.count("input.requested") == 1  # nobody was asked twice
    assert events.count("input.answered") == 1  # logged with the answer, never replayed
    assert ledger.refunded.count("o-1") >= 1


PARK_CHILD = CHILDREN / "park_child.py"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_park_in_one_process_resume_in_another(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        spec = str(tmp_path / "park.db")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")
        spec = f"postgres:{schema}:{dsn}"

    def child(mode: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(PARK_CHILD), spec, mode],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()[-1]

    assert child("park") == "suspended approve"
    assert child("resume") == "completed done: {'refunded': True}"
