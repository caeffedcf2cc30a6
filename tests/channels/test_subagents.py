"""Subagents: a tool runs another agent's turn as a child session whose ids derive from
the parent's call, so a replay of the parent never starts a second child turn."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from suite_paths import CHILDREN

import turnkit
from turnkit import (
    Agent,
    SubagentEvent,
    SurfacePolicy,
    ToolContext,
    ToolMessage,
    TriggerMessage,
    UserMessage,
    subagent,
    tool,
)
from turnkit._runtime.children import _stored_parent_answer
from turnkit._values.step_ids import input_step_id
from turnkit.stores import MemoryStore, SqliteStore
from turnkit.testing import CrashingStore, RecordingSink, ScriptedModel, ScriptedReply, tool_call


class _Outage(Exception):
    """The store failing under a delivery (in-process, unlike a SIGKILL)."""


def _outage() -> None:
    raise _Outage("store went away")


def boss(task: str = "find prices", **kwargs: Any) -> Agent:
    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("researcher", {"task": task})])
        if isinstance(last, ToolMessage):
            return f"boss: {last.result}"
        return "?"

    return Agent(
        name="boss",
        model=ScriptedModel(respond=respond),
        tools=[subagent("researcher", description="Researches a question and answers it.")],
        **kwargs,
    )


def researcher(model: ScriptedModel | None = None, **kwargs: Any) -> Agent:
    return Agent(name="researcher", model=model or ScriptedModel(["widgets cost 3"]), **kwargs)


async def test_a_subagent_answers_through_a_child_session(open_runtime: Any, sink: Any) -> None:
    child_model = ScriptedModel(["widgets cost 3"])
    runtime = await open_runtime(boss(), researcher(child_model))
    parent = runtime.session("boss", "s1")
    tid = parent.start("how much are widgets?")
    seen = [e async for e in parent.observe(tid)]
    result = await parent.result(tid)
    (tool_message,) = [m for m in await parent.messages() if isinstance(m, ToolMessage)]
    child_session = tool_message.result["session_id"]
    assert tool_message.result == {
        "agent": "researcher",
        "session_id": child_session,
        "text": "widgets cost 3",
    }
    assert child_session.startswith("s1/researcher/")
    assert result.text == f"boss: {tool_message.result}"
    # The child's opening is a trigger attributed to the parent agent, not a person.
    (opening, _answer) = await runtime.session("researcher", child_session).messages()
    assert isinstance(opening, TriggerMessage)
    assert (opening.text, opening.by) == ("find prices", "agent:boss")
    # The parent's observers saw the child's turn as nested events, in order.
    nested = [e for e in seen if isinstance(e, SubagentEvent)]
    assert [e.event.type for e in nested if e.event.type != "message.delta"] == [
        "turn.started",
        "message.completed",
        "turn.completed",
    ]
    deltas = [e.event for e in nested if isinstance(e.event, turnkit.MessageDeltaEvent)]
    assert "".join(d.text for d in deltas) == "widgets cost 3"
    assert all(
        (e.turn_id, e.session_id, e.agent, e.event.session_id)
        == (tid, "s1", "researcher", child_session)
        for e in nested
    )
    assert turnkit.event_from_dict(nested[-1].to_dict()) == nested[-1]
    assert len(child_model.calls) == 1


async def test_a_replayed_parent_reads_the_same_child_turn(make_store: Any) -> None:
    """The parent's delivery dies after the child's turn has ended but before the
    parent's tool step commits; redelivered, it reads the child's answer again."""
    child_model = ScriptedModel(["widgets cost 3"])

    # Commits: parent open, parent model step, child open, child answer, parent tool step.
    store = CrashingStore(make_store(), crash_at=5, when="before", on_crash=_outage)
    async with turnkit.Runtime([boss(), researcher(child_model)], store=store) as runtime:
        parent = runtime.session("boss", "s1")
        with pytest.raises(_Outage):
            await parent.result(parent.start("go", turn_id="p1"))
        store.crash_at = None
        result = await parent.result(parent.start("go", turn_id="p1"))
        assert result.status == "completed"
        children = [s for s in await runtime.sessions() if s.agent == "researcher"]
        assert len(children) == 1
        child = runtime.session("researcher", children[0].session_id)
        started = [e for e in await child.events() if e.type == "turn.started"]
        assert len(started) == 1
    assert len(child_model.calls) == 1  # the child's model was never asked twice


async def test_a_parked_child_parks_the_parent_and_the_answer_reaches_it(
    open_runtime: Any,
) -> None:
    deployed: list[bool] = []

    @tool
    async def deploy(ctx: ToolContext) -> dict[str, bool]:
        """Deploy once approved."""
        ok = await ctx.request_input("approve", "Deploy to prod?", schema={"type": "boolean"})
        deployed.append(bool(ok))
        return {"deployed": bool(ok)}

    def child_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, TriggerMessage):
            return ScriptedReply(tool_calls=[tool_call("deploy", {})])
        return f"child: {last.result}"

    runtime = await open_runtime(
        boss("ship it"), researcher(ScriptedModel(respond=child_reply), tools=[deploy])
    )
    parent = runtime.session("boss", "s1")
    event = turnkit.InboundEvent(
        source="slack", text="ship", user=turnkit.User(id="U1", attested=True)
    )
    tid = parent.start("ship", event=event)
    seen = [e async for e in parent.observe(tid)]
    result = await parent.result(tid)
    assert result.status == "suspended" and result.request is not None
    assert result.request.prompt == "Deploy to prod?"
    assert seen[-1].type == "input.requested"
    assert any(isinstance(e, SubagentEvent) and e.event.type == "input.requested" for e in seen)
    assert await parent.status() == "suspended"
    # The parent's speaker (attested) is the default answerer; anyone else is refused.
    with pytest.raises(turnkit.ResumeAuthorizationError):
        await parent.resume(tid, result.request.id, True, by="U2")
    resumed = await parent.resume(tid, result.request.id, True, by="U1")
    done = await parent.result(resumed)
    assert done.status == "completed"
    assert deployed == [True]
    assert "child: {'deployed': True}" in (done.text or "")
    children = [s for s in await runtime.sessions() if s.agent == "researcher"]
    assert [s.status for s in children] == ["idle"]


async def test_a_childs_decision_is_offered_to_the_parents_answerer_as_a_decision(
    open_runtime: Any,
) -> None:
    shipped: list[dict[str, Any]] = []

    def run(data: dict[str, Any], actx: turnkit.ActionContext) -> str:
        shipped.append(data)
        return f"shipped {data['order']}"

    ship = turnkit.define_action(
        name="ship",
        description="Ship an order.",
        input_schema={
            "type": "object",
            "properties": {"order": {"type": "string", "minLength": 2}},
            "required": ["order"],
        },
        run=run,
        approval=turnkit.Approval(allowed=("approve", "edit")),
    )

    def child_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, TriggerMessage):
            return ScriptedReply(tool_calls=[tool_call("ship", {"order": "A-1"})])
        return f"child: {last.result}"

    runtime = await open_runtime(
        boss("ship it"), researcher(ScriptedModel(respond=child_reply), tools=[ship])
    )
    parent = runtime.session("boss", "s1")
    event = turnkit.InboundEvent(
        source="slack", text="ship", user=turnkit.User(id="U1", attested=True)
    )
    result = await parent.result(parent.start("ship", event=event))
    request = result.request
    assert result.status == "suspended" and request is not None
    assert request.kind == "decision" and request.decision is not None
    assert request.decision.arguments == {"order": "A-1"}
    assert request.decision.allowed == ("approve", "edit")
    assert request.turn_id == result.turn_id and request.answerers == (
        turnkit.Answerers.user("U1"),
    )
    # Checked as a decision at the parent: nothing reaches the child that it would refuse.
    with pytest.raises(turnkit.InvalidAnswerError, match="order"):
        await parent.resume(
            result.turn_id, request.id, turnkit.Decision.edit({"order": "x"}), by="U1"
        )
    with pytest.raises(turnkit.InvalidAnswerError, match="not allowed"):
        await parent.resume(result.turn_id, request.id, turnkit.Decision.reject(), by="U1")
    edit = turnkit.Decision.edit({"order": "B-2"})
    done = await parent.result(await parent.resume(result.turn_id, request.id, edit, by="U1"))
    assert done.status == "completed" and shipped == [{"order": "B-2"}]
    assert "child: shipped B-2" in (done.text or "")


async def test_the_child_runs_under_the_parents_source(open_runtime: Any) -> None:
    """A source's deny_tools cannot be sidestepped by handing the task to a subagent."""
    ran: list[str] = []

    @tool
    def wipe() -> str:
        """Wipe the database."""
        ran.append("wipe")
        return "wiped"

    def child_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, TriggerMessage):
            return ScriptedReply(tool_calls=[tool_call("wipe", {})])
        return f"child: {last.result}"

    child = researcher(
        ScriptedModel(respond=child_reply),
        tools=[wipe],
        surfaces={"email": SurfacePolicy(deny_tools=("wipe",))},
    )
    runtime = await open_runtime(boss("wipe it"), child)
    email = turnkit.InboundEvent(source="email", text="wipe", user=turnkit.User(id="x@y.z"))
    text = await runtime.session("boss", "s1").turn("wipe", event=email)
    assert ran == []
    assert "unknown tool: wipe" in text


async def test_a_failing_child_is_an_error_result_the_parent_reads(open_runtime: Any) -> None:
    child = researcher(ScriptedModel([RuntimeError("model down")]))
    runtime = await open_runtime(boss(), child)
    text = await runtime.session("boss", "s1").turn("go")
    assert text.startswith("boss: {'error': 'SubagentError: researcher failed:")


async def test_a_subagent_for_an_agent_the_runtime_lacks_fails_the_turn(
    open_runtime: Any,
) -> None:
    runtime = await open_runtime(boss())
    result = await runtime.session("boss", "s1").result(runtime.session("boss", "s1").start("go"))
    assert result.status == "failed"
    assert "agent 'researcher' is not in the runtime" in (result.error or "")


CHILD = CHILDREN / "subagent_child.py"
#: Commits of one full run: parent queued (``turn`` submits durably), parent open,
#: parent model, child open, child model, child tool (the note), child answer,
#: parent tool, parent answer.
COMMITS = 9


def _notes(kind: str, spec: str, dsn: str | None, schema: str | None) -> int:
    if kind == "sqlite":
        with sqlite3.connect(spec) as conn:
            return int(conn.execute("SELECT count(*) FROM notes").fetchone()[0])
    import psycopg

    with psycopg.connect(dsn or "", autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".notes').fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("crash_at", range(1, COMMITS + 1))
def test_a_parent_killed_mid_child_recovers_with_exactly_one_child_turn(
    kind: str, crash_at: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    dsn = schema = None
    if kind == "sqlite":
        spec = str(tmp_path / "sub.db")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")
        spec = f"postgres:{schema}:{dsn}"

    def child(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(CHILD), spec, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    killed = child("run", str(crash_at))
    assert killed.returncode == -9, killed.stdout + killed.stderr  # SIGKILL
    recovered = child("recover")
    assert recovered.returncode == 0, recovered.stderr
    summary = json.loads(recovered.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed"
    assert summary["text"] == "boss says: researched: prices of widgets"
    assert summary["child_sessions"] == 1
    assert len(summary["child_turns"]) == 1
    assert _notes(kind, spec, dsn, schema) == 1  # the child's side effect happened once


def test_the_crash_test_counts_every_commit_of_a_run(tmp_path: Path) -> None:
    """Keeps COMMITS honest: a run without a crash makes exactly that many commits."""
    import asyncio

    sys.path.insert(0, str(CHILD.parent))
    try:
        import subagent_child
    finally:
        sys.path.pop(0)

    async def run() -> int:
        store = CrashingStore(turnkit.stores.SqliteStore(tmp_path / "count.db"))
        async with turnkit.Runtime(
            subagent_child.agents(), store=store, sink=RecordingSink()
        ) as rt:
            await rt.session("boss", "s1").turn("research widgets")
        return store.commits

    assert asyncio.run(run()) == COMMITS


async def test_a_child_cannot_use_a_tool_its_parent_turn_was_denied(open_runtime: Any) -> None:
    """The child agent has the tool and no policy of its own: the parent turn's
    denial still holds, so the task cannot be laundered through a subagent."""
    refunded: list[str] = []

    @tool
    def issue_refund(order_id: str) -> str:
        """Refund an order."""
        refunded.append(order_id)
        return "refunded"

    def boss_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("billing", {"task": "refund o-1"})])
        return f"boss: {last.result}"

    def billing_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, TriggerMessage):
            return ScriptedReply(tool_calls=[tool_call("issue_refund", {"order_id": "o-1"})])
        return f"billing: {last.result}"

    boss_agent = Agent(
        name="boss",
        model=ScriptedModel(respond=boss_reply),
        tools=[issue_refund, subagent("billing", description="Handles billing.")],
        surfaces={"slack": SurfacePolicy(deny_tools=("issue_refund",))},
    )
    billing_model = ScriptedModel(respond=billing_reply)
    billing = Agent(name="billing", model=billing_model, tools=[issue_refund])
    runtime = await open_runtime(boss_agent, billing)
    slack = turnkit.InboundEvent(
        source="slack", text="refund", user=turnkit.User(id="U1", attested=True)
    )
    text = await runtime.session("boss", "s1").turn("ask billing to refund o-1", event=slack)
    assert refunded == []
    assert "unknown tool: issue_refund" in text
    assert billing_model.calls[0].tools == ()
    # Without the parent's denial (a turn from elsewhere) the same chain may refund.
    await runtime.session("boss", "s2").turn("ask billing to refund o-1")
    assert refunded == ["o-1"]


async def test_a_replayed_parent_does_not_rerun_a_child_that_failed(make_store: Any) -> None:
    child_model = ScriptedModel([RuntimeError("model down"), "a second answer"])

    # Commits: parent open, parent model, child open, child failure, parent tool step.
    store = CrashingStore(make_store(), crash_at=5, when="before", on_crash=_outage)
    async with turnkit.Runtime([boss(), researcher(child_model)], store=store) as runtime:
        parent = runtime.session("boss", "s1")
        with pytest.raises(_Outage):
            await parent.result(parent.start("go", turn_id="p1"))
        store.crash_at = None
        result = await parent.result(parent.start("go", turn_id="p1"))
    assert len(child_model.calls) == 1
    assert (result.text or "").startswith("boss: {'error': 'SubagentError: researcher failed:")


async def test_a_parent_turn_id_reused_after_a_reset_runs_a_new_child(open_runtime: Any) -> None:
    """The child's ids come from the parent call's idempotency key, which a reset
    changes: generation 1's turn ``p1`` must not read generation 0's child answer."""
    child_model = ScriptedModel(["old prices", "new prices"])
    runtime = await open_runtime(boss(), researcher(child_model))
    parent = runtime.session("boss", "s1")
    first = await parent.result(parent.start("go", turn_id="p1"))
    await parent.reset()
    second = await parent.result(parent.start("go", turn_id="p1"))
    assert "old prices" in (first.text or "") and "new prices" in (second.text or "")
    assert len(child_model.calls) == 2
    children = [s for s in await runtime.sessions() if s.agent == "researcher"]
    assert len(children) == 2


async def test_a_childs_policy_question_is_answered_with_the_parents_grant(
    open_runtime: Any,
) -> None:
    """The child asks a policy; the parent parks with it, is answered through
    grant_answer, and the child receives that answer (vouched for from what the
    parent stored), not one minted on its own."""
    deployed: list[bool] = []

    @tool
    async def deploy(ctx: ToolContext) -> dict[str, bool]:
        """Deploy once release approves."""
        ok = await ctx.request_input(
            "approve",
            "Deploy to prod?",
            schema={"type": "boolean"},
            answerers=turnkit.Answerers.policy("release"),
        )
        deployed.append(bool(ok))
        return {"deployed": bool(ok)}

    def child_reply(messages: Any) -> Any:
        if isinstance(messages[-1], TriggerMessage):
            return ScriptedReply(tool_calls=[tool_call("deploy", {})])
        return f"child: {messages[-1].result}"

    async def authorize(check: turnkit.AnswerCheck) -> bool:
        return check.policy == "release" and check.by == "lead"

    runtime = await open_runtime(
        boss("ship it", authorize_answer=authorize),
        researcher(ScriptedModel(respond=child_reply), tools=[deploy]),
    )
    parent = runtime.session("boss", "s1")
    tid = parent.start("ship")
    parked = await parent.result(tid)
    assert parked.request is not None
    assert parked.request.answerers == (turnkit.Answerers.policy("release"),)
    with pytest.raises(turnkit.ResumeAuthorizationError):
        await parent.resume(tid, parked.request.id, True, by="lead")  # by alone: no
    resume = turnkit.ResumeRequest(turn_id=tid, input_id=parked.request.id, value=True, by="lead")
    grant = await turnkit.grant_answer(parent, resume)
    await parent.resume(tid, parked.request.id, True, by="lead", granted=grant)
    done = await parent.result(tid)
    assert done.status == "completed" and deployed == [True]
    (child,) = [s for s in await runtime.sessions() if s.agent == "researcher"]
    child_session = runtime.session("researcher", child.session_id)
    (child_turn,) = {m.turn_id for m in await child_session.messages()}
    steps = (await child_session._store.load(child_turn)).steps
    (answer,) = [v for k, v in steps.items() if k.startswith("input:")]
    assert answer == {"value": True, "by": "lead"}


async def test_a_child_answer_is_passed_on_only_from_the_parents_stored_answer(
    open_runtime: Any,
) -> None:
    seen: list[ToolContext] = []

    @tool
    async def look(ctx: ToolContext) -> str:
        """Look."""
        seen.append(ctx)
        return "ok"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("look", {})])
        return "done"

    runtime = await open_runtime(
        Agent(name="a", model=ScriptedModel(respond=respond), tools=[look])
    )
    await runtime.session("a", "s1").turn("go")
    (ctx,) = seen
    with pytest.raises(turnkit.FatalToolError, match="no stored answer"):
        _stored_parent_answer(ctx, "tool:1:call_1/approve")
    stored = {input_step_id(ctx.turn_id, "tool:1:call_1/approve"): {"value": 1, "by": "u"}}
    answered = dataclasses.replace(ctx, _steps=stored)
    assert _stored_parent_answer(answered, "tool:1:call_1/approve") == {"value": 1, "by": "u"}


async def test_a_child_turn_is_its_parents_tenants_and_spends_its_budget(
    make_store: Any,
) -> None:
    """The child turn is stored under the parent turn's tenant, so its model call is
    counted in that tenant's usage, not the default tenant's."""
    used = turnkit.Usage(input_tokens=10, output_tokens=5)

    def child_reply(messages: Any) -> Any:
        return ScriptedReply(text="widgets cost 3", usage=used)

    def parent_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            call = tool_call("researcher", {"task": "find prices"})
            return ScriptedReply(tool_calls=[call], usage=used)
        return ScriptedReply(text="boss: done", usage=used)

    parent_agent = dataclasses.replace(boss(), model=ScriptedModel(respond=parent_reply))
    budget = turnkit.Budget(per_tenant=turnkit.Limit(tokens=1_000_000))
    store = make_store()
    agents = [parent_agent, researcher(ScriptedModel(respond=child_reply))]
    async with turnkit.Runtime(agents, store=store, budget=budget) as runtime:
        parent = runtime.session("boss", "s1")
        tid = await parent.submit("how much are widgets?", tenant="acme")
        assert (await parent.result(tid)).status == "completed"
        (child_info,) = [s for s in await runtime.sessions() if s.agent == "researcher"]
        child = store.session(child_info.session_id)
        (started,) = [e for e in await child.events() if e.type == "turn.started"]
        child_turn = await child.turn(started.turn_id)
        assert child_turn is not None and child_turn.tenant == "acme"
        by_tenant = await store.usage_by_tenant()
        # Two model calls of the parent and one of the child, all acme's.
        assert set(by_tenant) == {"acme"}
        assert (by_tenant["acme"].calls, by_tenant["acme"].input_tokens) == (3, 30)
        child_spend, _ = await store.session(child_info.session_id).spend("acme")
        assert child_spend.calls == 1


async def test_a_child_resumed_by_its_parent_rides_on_the_parents_tenant_slot(
    make_store: Any,
) -> None:
    """With one slot for the tenant, the parent holds it while it passes its answer on
    to its parked child; the child's replay must not wait for a slot of its own (it
    would wait for its parent, which waits for it)."""

    @tool
    async def deploy(ctx: ToolContext) -> str:
        """Deploy once approved."""
        ok = await ctx.request_input("approve", "Deploy to prod?", schema={"type": "boolean"})
        return f"deployed={ok}"

    def child_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, TriggerMessage):
            return ScriptedReply(tool_calls=[tool_call("deploy", {})])
        return f"child: {last.result}"

    agents = [boss("ship it"), researcher(ScriptedModel(respond=child_reply), tools=[deploy])]
    caps = turnkit.Concurrency(per_tenant=1)
    async with turnkit.Runtime(agents, store=make_store(), concurrency=caps) as runtime:
        parent = runtime.session("boss", "s1")
        tid = await parent.submit("ship", tenant="acme")
        parked = await parent.result(tid)
        assert parked.status == "suspended" and parked.request is not None
        await parent.resume(tid, parked.request.id, True)
        done = await asyncio.wait_for(parent.result(tid), 30)
        assert done.status == "completed" and "deployed=True" in (done.text or "")


class _Crash(Exception):
    """The process dying with its turns running (its deliveries cut off mid-turn)."""


class Digs:
    """The researcher's tool, which waits for the test: who digs right now, how many
    did at once at most, and each call made."""

    def __init__(self) -> None:
        self.now: list[str] = []
        self.most = 0
        self.calls: list[str] = []
        self.release = asyncio.Event()

    def agent(self) -> Agent:
        @tool
        async def dig(ctx: ToolContext) -> str:
            """Dig (until the test lets the call end)."""
            self.calls.append(ctx.session_id)
            self.now.append(ctx.session_id)
            self.most = max(self.most, len(self.now))
            try:
                await self.release.wait()
            finally:
                self.now.remove(ctx.session_id)
            return "dug"

        def reply(messages: Any) -> Any:
            last = messages[-1]
            if isinstance(last, ToolMessage):
                return f"researched: {last.result}"
            return ScriptedReply(tool_calls=[tool_call("dig", {})])

        return researcher(ScriptedModel(respond=reply), tools=[dig])


@pytest.mark.parametrize(
    "caps",
    [turnkit.Concurrency(per_tenant=1), turnkit.Concurrency(tenants={"acme": 1})],
    ids=["per-tenant", "named-tenant"],
)
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_recovery_keeps_the_tenants_cap_and_a_child_rides_on_its_recovered_parent(
    kind: str, caps: turnkit.Concurrency, tmp_path: Path
) -> None:
    """A process died while tenant acme's parent turn waited on its child and another of
    acme's turns ran: all three are left running. A new runtime capping acme at 1
    recovers them with acme's cap: one of acme's turns holds the slot at a time, and
    the parent's child, recovered beside it, rides on the parent's slot once the parent
    asks for it (waiting for a slot of its own, it would wait for the parent holding
    the only one, which waits for it). Every turn ends, once."""
    memory = MemoryStore()

    def open_store() -> turnkit.stores.Store:
        return memory if kind == "memory" else SqliteStore(tmp_path / "crashed.db")

    digs = Digs()
    agents = [boss(), digs.agent()]
    with pytest.raises(_Crash):
        async with turnkit.Runtime(agents, store=open_store()) as dying:
            await dying.session("boss", "s1").submit("how much?", tenant="acme")
            await eventually(lambda: len(digs.now) == 1, what="the child turn digging")
            await dying.session("researcher", "other").submit("dig too", tenant="acme")
            await eventually(lambda: len(digs.now) == 2, what="both of acme's turns digging")
            raise _Crash
    left = await _unfinished(open_store())
    assert sorted(r.session_id.split("/")[0] for r in left) == ["other", "s1", "s1"]

    digs.calls.clear()
    digs.most = 0
    sink = RecordingSink()
    async with turnkit.Runtime(agents, store=open_store(), sink=sink, concurrency=caps) as rt:
        recovering = asyncio.ensure_future(rt.recover())
        await eventually(lambda: digs.now, what="a turn of acme's digging")
        await asyncio.sleep(0.2)  # not a wait: a window in which a second slot would show
        assert len(digs.now) == 1, digs.now
        digs.release.set()
        results = await asyncio.wait_for(recovering, 30)
    assert sorted(r.status for r in results) == ["completed"] * 3, results
    ended = Counter(e.turn_id for e in sink.events if e.type == "turn.completed")
    assert sorted(ended.values()) == [1, 1, 1] and set(ended) == {r.turn_id for r in left}
    assert sorted(s.split("/")[0] for s in digs.calls) == ["other", "s1"]
    assert digs.most == 1
    assert await _unfinished(open_store()) == []


async def _unfinished(store: turnkit.stores.Store) -> list[turnkit.TurnRecord]:
    """The turns ``store`` holds unfinished, read with the store opened for it."""
    await store.open()
    try:
        return await store.unfinished_turns()
    finally:
        await store.close()
