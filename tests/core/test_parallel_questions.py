"""Several questions at once: the calls of one model step that each ask for input park
the turn on all of them; each is answered on its own (any order, any process, each
by its own answerers) and the turn goes on after the last; cancel and reset end all."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from postgres_support import drop_schema, new_schema, postgres_dsn
from server_support import serving
from suite_paths import CHILDREN

import turnkit
from turnkit import (
    Answerers,
    InputAnsweredEvent,
    InputRequestedEvent,
    ResumeAuthorizationError,
    ResumeConflictError,
    ToolContext,
    ToolMessage,
    UserMessage,
    tool,
)
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

APPROVERS = {"o-1": "ana", "o-2": "bo"}
CHILD = CHILDREN / "two_approvals_child.py"


def refund_agent(refunded: list[str], *, parallel: int = 4) -> turnkit.Agent:
    @tool
    async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order once its approver says yes."""
        yes = await ctx.request_input(
            "approve-refund",
            f"Refund {order_id}?",
            schema={"type": "boolean"},
            answerers=Answerers.user(APPROVERS[order_id]),
        )
        if yes:
            refunded.append(order_id)
        return {"order": order_id, "refunded": yes}

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage | turnkit.TriggerMessage):  # (a child's opening)
            return ScriptedReply(
                tool_calls=[tool_call("refund", {"order_id": order}) for order in APPROVERS]
            )
        results = [m.result for m in messages if isinstance(m, ToolMessage)]
        return "; ".join(f"{r['order']}: {r['refunded']}" for r in results)

    model = ScriptedModel(respond=respond)
    return turnkit.Agent(name="a", model=model, tools=[refund], max_parallel_tools=parallel)


def by_order(requests: Any) -> dict[str, Any]:
    return {r.prompt.split()[1].rstrip("?"): r for r in requests}


async def test_two_questions_park_the_turn_on_both(open_runtime: Any) -> None:
    refunded: list[str] = []
    rt = await open_runtime(refund_agent(refunded))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("refund both"))
    assert parked.status == "suspended"
    assert len(parked.requests) == 2 and parked.request == parked.requests[0]
    first, second = parked.requests
    # Both calls asked "approve-refund": each request gets an id of its own.
    assert first.call_id != second.call_id
    assert (first.id, second.id) == (
        f"approve-refund@{first.call_id}",
        f"approve-refund@{second.call_id}",
    )
    assert [a.user_id for a in first.answerers] == ["ana"]
    assert [a.user_id for a in second.answerers] == ["bo"]
    assert await session.pending() == first  # the single-question reading still works
    assert await session.pending_all() == [first, second]
    logged = [e for e in await session.events() if isinstance(e, InputRequestedEvent)]
    assert [e.requests for e in logged] == [(first, second)]
    with pytest.raises(turnkit.SessionSuspendedError):
        await session.turn("another")  # one park at a time, as before
    assert refunded == []


@pytest.mark.parametrize("order", [("o-1", "o-2"), ("o-2", "o-1")])
async def test_each_is_answered_on_its_own_and_the_last_answer_resumes(
    open_runtime: Any, order: tuple[str, str]
) -> None:
    refunded: list[str] = []
    rt = await open_runtime(refund_agent(refunded))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("refund both"))
    requests = by_order(parked.requests)
    early, late = order
    tid = await session.resume(parked.turn_id, requests[early].id, True, by=APPROVERS[early])
    half = await session.result(tid)
    assert half.status == "suspended" and half.requests == (requests[late],)
    assert await session.pending_all() == [requests[late]]
    assert await session.status() == "suspended"
    assert refunded == []  # nothing runs until the last answer
    await session.resume(parked.turn_id, requests[late].id, False, by=APPROVERS[late])
    done = await session.result(tid)
    assert done.status == "completed"
    assert done.text == f"o-1: {early == 'o-1'}; o-2: {early == 'o-2'}"
    assert refunded == [early]
    assert await session.pending_all() == []
    events = [e for e in await session.events() if e.type.startswith("input.")]
    assert [e.type for e in events] == [
        "input.requested",
        "input.answered",
        "input.requested",  # what was still open after the first answer
        "input.answered",
    ]
    answered = [e for e in events if isinstance(e, InputAnsweredEvent)]
    assert [(e.input_id, e.by) for e in answered] == [
        (requests[early].id, APPROVERS[early]),
        (requests[late].id, APPROVERS[late]),
    ]
    assert events[2].requests == (requests[late],)  # type: ignore[attr-defined]
    assert [getattr(e, "still_open", None) for e in events] == [False, None, True, None]


async def test_a_wrong_answerer_for_one_leaves_both_answerable(open_runtime: Any) -> None:
    refunded: list[str] = []
    rt = await open_runtime(refund_agent(refunded))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("refund both"))
    requests = by_order(parked.requests)
    with pytest.raises(ResumeAuthorizationError, match="ana"):
        await session.resume(parked.turn_id, requests["o-1"].id, True, by="bo")
    assert await session.pending_all() == list(parked.requests)
    with pytest.raises(ResumeConflictError, match="approve-refund@"):
        await session.resume(parked.turn_id, "approve-refund", True, by="ana")
    await session.resume(parked.turn_id, requests["o-2"].id, True, by="bo")
    await session.resume(parked.turn_id, requests["o-1"].id, True, by="ana")
    assert (await session.result(parked.turn_id)).text == "o-1: True; o-2: True"
    assert sorted(refunded) == ["o-1", "o-2"]


async def test_questions_with_their_own_ids_keep_them(open_runtime: Any) -> None:
    @tool
    async def ask(what: str, ctx: ToolContext) -> str:
        """Asks one question."""
        return str(await ctx.request_input(what, f"{what}?"))

    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("ask", {"what": w}) for w in ("x", "y")]), "ok"]
    )
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[ask]))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("ask"))
    assert [r.id for r in parked.requests] == ["x", "y"]
    await session.resume(parked.turn_id, "y", "why")
    await session.resume(parked.turn_id, "x", "ex")
    assert (await session.result(parked.turn_id)).text == "ok"
    results = [m.result for m in await session.messages() if isinstance(m, ToolMessage)]
    assert results == ["ex", "why"]


async def test_cancel_ends_every_question(open_runtime: Any) -> None:
    refunded: list[str] = []
    rt = await open_runtime(refund_agent(refunded))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("refund both"))
    requests = by_order(parked.requests)
    await session.resume(parked.turn_id, requests["o-1"].id, True, by="ana")
    await session.result(parked.turn_id)
    assert await session.cancel() == [parked.turn_id]
    ended = await session.result(parked.turn_id)
    assert ended.status == "cancelled"
    assert await session.pending_all() == []
    results = [m for m in await session.messages() if isinstance(m, ToolMessage)]
    assert [m.result for m in results] == [{"cancelled": True, "reason": "requested"}] * 2
    with pytest.raises(ResumeConflictError):
        await session.resume(parked.turn_id, requests["o-2"].id, True, by="bo")
    assert refunded == []


async def test_reset_ends_every_question(open_runtime: Any) -> None:
    rt = await open_runtime(refund_agent([]))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("refund both"))
    await session.reset()
    assert await session.pending_all() == [] and await session.pending() is None
    with pytest.raises(ResumeConflictError):
        await session.resume(parked.turn_id, parked.requests[0].id, True, by="ana")


# -- two users, two processes ----------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "approvals.db")
        return
    dsn = postgres_dsn()
    schema = new_schema()
    yield f"postgres:{schema}:{dsn}"
    drop_schema(dsn, schema)
    Path("/tmp/" + schema + ".refunds").unlink(missing_ok=True)


def child(spec: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(CHILD), spec, *args],
        capture_output=True,
        text=True,
        timeout=120,  # only so a wedged child cannot hang the suite
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def refunds(spec: str) -> list[str]:
    from two_approvals_child import refunds_path

    path = Path(refunds_path(spec))
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("first", ["o-1", "o-2"])
def test_two_users_in_two_processes_answer_in_either_order(store_spec: str, first: str) -> None:
    parked = child(store_spec, "park")
    assert parked["status"] == "suspended" and len(parked["open"]) == 2
    second = "o-2" if first == "o-1" else "o-1"
    # The second approver, trying the first one's question, is refused; both stay open.
    refused = child(store_spec, "answer", first, APPROVERS[second])
    assert "may be answered only by user " + APPROVERS[first] in refused["refused"]
    assert refused["open"] == parked["open"]
    half = child(store_spec, "answer", first, APPROVERS[first])
    assert half["status"] == "suspended" and len(half["open"]) == 1
    done = child(store_spec, "answer", second, APPROVERS[second])
    assert done == {"status": "completed", "open": [], "text": "o-1: True; o-2: True"}
    assert sorted(refunds(store_spec)) == ["o-1", "o-2"]  # each refund ran once


# -- over HTTP ----------------------------------------------------------------------


async def test_http_lists_both_questions_and_each_named_answerer_answers_one(
    open_runtime: Any,
) -> None:
    refunded: list[str] = []
    runtime = await open_runtime(refund_agent(refunded))
    async with serving(runtime) as served:
        alice = {"X-User": "alice"}
        parked = await served.client.post(
            served.path("a", "s1", "chat"), json={"text": "refund both"}, headers=alice
        )
        body = parked.json()
        assert body["status"] == "suspended" and len(body["requests"]) == 2
        assert body["request"] == body["requests"][0]
        pending = await served.client.get(served.path("a", "s1", "pending"), headers=alice)
        assert pending.json()["requests"] == body["requests"]
        requests = {r["prompt"]: r for r in body["requests"]}
        second = requests["Refund o-2?"]
        first = requests["Refund o-1?"]
        # bo may answer only o-2 (he is named there, and the session is alice's).
        wrong = await served.client.post(
            served.path("a", "s1", "resume"),
            json={"turn_id": body["turn_id"], "input_id": first["id"], "value": True},
            headers={"X-User": "bo"},
        )
        assert wrong.status_code == 404
        # bo and ana may answer, not read the session: each learns the outcome only.
        for who, request in (("bo", second), ("ana", first)):
            answered = await served.client.post(
                served.path("a", "s1", "resume"),
                json={"turn_id": body["turn_id"], "input_id": request["id"], "value": True},
                headers={"X-User": who},
            )
            assert answered.status_code == 200, answered.text
            assert answered.json() == {
                "status": "accepted",
                "turn_id": body["turn_id"],
                "input_id": request["id"],
            }
            if who == "bo":
                still = await served.client.get(served.path("a", "s1", "pending"), headers=alice)
                assert [r["id"] for r in still.json()["requests"]] == [first["id"]]
        done = await runtime.session("a", "s1").result(body["turn_id"])
        assert done.status == "completed"
        assert sorted(refunded) == ["o-1", "o-2"]


async def test_a_child_waiting_on_two_questions_relays_them_to_the_parent(
    open_runtime: Any,
) -> None:
    refunded: list[str] = []
    child = refund_agent(refunded)
    child = turnkit.Agent(name="clerk", model=child.model, tools=child.tools, max_parallel_tools=4)

    def boss_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("clerk", {"task": "refund both"})])
        return f"boss: {last.result['text']}"

    boss = turnkit.Agent(
        name="boss",
        model=ScriptedModel(respond=boss_reply),
        tools=[turnkit.subagent("clerk", description="Handles refunds.")],
    )
    rt = await open_runtime(boss, child)
    parent = rt.session("boss", "s1")
    result = await parent.result(parent.start("refunds please"))
    answered: list[str] = []
    while result.status == "suspended":  # the child's questions, one after the other
        request = result.request
        assert request is not None
        order = request.prompt.split()[1].rstrip("?")
        answered.append(order)
        await parent.resume(result.turn_id, request.id, True, by=APPROVERS[order])
        result = await parent.result(result.turn_id)
    assert result.text == "boss: o-1: True; o-2: True"
    assert answered == ["o-1", "o-2"] and sorted(refunded) == ["o-1", "o-2"]
