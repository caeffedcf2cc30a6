"""``POST /agents/{agent}/sessions/{session}/wake``: ending a parked turn's waits on
the clock early over HTTP, authorized as ``wake``; on an HTTP node the woken turn
is run by a worker (a real ``Worker`` on PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from server_support import dump, serving

import turnkit
from turnkit import ToolContext, tool
from turnkit.server import Principal, SessionAccess, owner_only
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

ALICE = {"X-User": "alice"}
BOB = {"X-User": "bob"}


def desk_agent() -> turnkit.Agent:
    """``desk``: "sleep" waits a week in its tool, "ask" asks a person; else it echoes."""

    @tool
    async def later(what: str, ctx: ToolContext) -> str:
        """Waits a week, or asks first."""
        if what == "ask":
            ok = await ctx.request_input("ok", "Go on?", schema={"type": "boolean"})
            return f"asked: {ok}"
        await ctx.sleep(timedelta(days=7))
        return "slept"

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage):
            if last.text in ("sleep", "ask"):
                return ScriptedReply(tool_calls=[tool_call("later", {"what": last.text})])
            return ScriptedReply(text=f"you said {last.text}")
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(text=f"then: {last.result}")

    return turnkit.Agent(name="desk", model=ScriptedModel(respond=respond), tools=[later])


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[turnkit.Runtime]:
    async with turnkit.Runtime([desk_agent()], store=SqliteStore(tmp_path / "w.db")) as rt:
        yield rt


def path(session: str) -> str:
    return f"/agents/desk/sessions/{session}/wake"


async def test_wake_ends_a_sleep_early_and_records_who(runtime: turnkit.Runtime) -> None:
    async with serving(runtime) as served:
        slept = await served.client.post(
            "/agents/desk/sessions/s1/chat", json={"text": "sleep"}, headers=ALICE
        )
        assert slept.json()["status"] == "suspended", slept.text
        turn_id = slept.json()["turn_id"]
        woken = await served.client.post(path("s1"), headers=ALICE)
        assert woken.status_code == 200, woken.text
        assert woken.json() == {"woken": True, "turn_id": turn_id}
        session = runtime.session("desk", "s1")
        assert (await session.result(turn_id)).text == "then: slept"
        answered = [e for e in await session.events() if e.type == "input.answered"]
        assert [getattr(e, "by", None) for e in answered] == ["alice"]
        # Nothing waits any more: a second wake ends nothing, and says so.
        again = await served.client.post(path("s1"), json={}, headers=ALICE)
        assert again.json() == {"woken": False, "turn_id": None}


async def test_wake_leaves_a_question_for_a_person_open(runtime: turnkit.Runtime) -> None:
    async with serving(runtime) as served:
        asked = await served.client.post(
            "/agents/desk/sessions/s2/chat", json={"text": "ask"}, headers=ALICE
        )
        turn_id = asked.json()["turn_id"]
        woken = await served.client.post(path("s2"), json={"turn_id": turn_id}, headers=ALICE)
        assert woken.json() == {"woken": False, "turn_id": None}
        pending = await served.client.get("/agents/desk/sessions/s2/pending", headers=ALICE)
        assert pending.json()["request"]["id"] == "ok"


async def test_wake_is_refused_like_a_missing_session_and_checks_its_body(
    runtime: turnkit.Runtime, tmp_path: Path
) -> None:
    seen: list[SessionAccess] = []

    def readers_may_not_wake(principal: Principal, access: SessionAccess) -> bool:
        seen.append(access)
        if principal.id == "bob":
            return access.action == "read"  # bob reads alice's sessions, and no more
        return owner_only(principal, access)

    async with serving(runtime, authorize=readers_may_not_wake) as served:
        slept = await served.client.post(
            "/agents/desk/sessions/s3/chat", json={"text": "sleep"}, headers=ALICE
        )
        turn_id = slept.json()["turn_id"]
        before = dump(tmp_path / "w.db")
        for session in ("s3", "ghost"):
            refused = await served.client.post(path(session), headers=BOB)
            assert refused.status_code == 404, refused.text
            assert refused.json()["code"] == "unknown_session"
        ghost = await served.client.post(path("ghost"), headers=ALICE)  # nothing to wake
        assert ghost.status_code == 404 and ghost.json()["code"] == "unknown_session"
        for body, wanted in [
            ({"turn_id": 5}, "turn_id must be a string"),
            ({"turn_id": ""}, "turn_id must not be empty"),
            ({"turn": turn_id}, "turn"),
        ]:
            bad = await served.client.post(path("s3"), json=body, headers=ALICE)
            assert bad.status_code == 400 and wanted in bad.json()["error"], bad.text
        assert dump(tmp_path / "w.db") == before
        other = await served.client.post(path("s3"), json={"turn_id": "t-x"}, headers=ALICE)
        assert other.json() == {"woken": False, "turn_id": None}
        woken = await served.client.post(path("s3"), json={"turn_id": turn_id}, headers=ALICE)
        assert woken.json() == {"woken": True, "turn_id": turn_id}
    assert [a.action for a in seen if a.session_id == "s3" and a.action == "wake"]
    assert (await runtime.session("desk", "s3").result(turn_id)).text == "then: slept"


async def test_on_an_http_node_a_worker_runs_the_woken_turn(pg_dsn: str, pg_schema: str) -> None:
    """On an HTTP node (a ``RuntimeClient``) the node records the wake (the turn moves to
    ``running``) and the deployment's worker claims and finishes it; it runs nothing."""
    from turnkit.stores import PostgresStore

    async with (
        turnkit.Runtime([desk_agent()], store=PostgresStore(pg_dsn, schema=pg_schema)) as workers,
        turnkit.RuntimeClient(
            [desk_agent()], store=PostgresStore(pg_dsn, schema=pg_schema)
        ) as node,
    ):
        worker = turnkit.Worker(workers, poll=5.0)  # the wake's notification, not a poll
        running = asyncio.create_task(worker.run())
        try:
            async with serving(node) as served:
                slept = await served.client.post(
                    "/agents/desk/sessions/n1/chat", json={"text": "sleep"}, headers=ALICE
                )
                assert slept.json()["status"] == "suspended", slept.text
                turn_id = slept.json()["turn_id"]
                session = node.session("desk", "n1")
                claimed = worker.claimed
                woken = await served.client.post(path("n1"), headers=ALICE)
                assert woken.json() == {"woken": True, "turn_id": turn_id}
                done = await session.result(turn_id)
                assert done.text == "then: slept"
                assert worker.claimed == claimed + 1  # the node has nothing to run it with
        finally:
            worker.stop()
            await running
