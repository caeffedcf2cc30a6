"""The operator console's API (issue 38), mounted in ``create_app`` behind its
``authenticate`` and ``authorize``, on every store: lists and filters, a turn's
timeline, live counts, and each action authorized and audited."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from server_support import serving

import turnkit
from turnkit import FatalToolError, ToolContext, UserMessage, tool
from turnkit.server import Console, ConsoleAudit, Principal, SessionAccess
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

FIXED: dict[str, bool] = {"db": False}


def ops_agent(name: str = "ops") -> turnkit.Agent:
    @tool
    async def deploy(service: str, ctx: ToolContext) -> str:
        """Deploy after approval; the database is locked down until it is fixed."""
        if service == "db" and not FIXED["db"]:
            raise FatalToolError("the database is locked down")
        if service == "api":
            ok = await ctx.request_input(
                "approve", f"Deploy {service}?", schema={"type": "boolean"}
            )
            return "deployed" if ok else "kept"
        return "deployed"

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("deploy", {"service": last.text})])
        return f"done: {last.result}"

    return turnkit.Agent(name=name, model=ScriptedModel(respond=respond), tools=[deploy])


def operators(principal: Principal, access: SessionAccess) -> bool:
    """Operators see and do everything; a viewer may list and read only."""
    role = principal.claims.get("role")
    return role == "operator" or (role == "viewer" and access.action in ("list", "read"))


def by_role(request: Any) -> Principal | None:
    user = request.headers.get("x-user")
    return Principal(id=user, claims={"role": request.headers.get("x-role")}) if user else None


OPERATOR = {"X-User": "olga", "X-Role": "operator"}
VIEWER = {"X-User": "vic", "X-Role": "viewer"}


async def populated(open_runtime: Any) -> turnkit.Runtime:
    FIXED["db"] = False
    rt = await open_runtime(ops_agent(), ops_agent("other"))
    parked = rt.session("ops", "s-park")
    assert (await parked.result(parked.start("api"))).status == "suspended"
    failed = rt.session("ops", "s-fail")
    assert (await failed.result(failed.start("db"))).status == "failed"
    assert await rt.session("ops", "s-done").turn("web") == "done: deployed"
    assert await rt.session("other", "s-other").turn("web") == "done: deployed"
    return rt


async def test_sessions_filter_page_and_authorize(open_runtime: Any) -> None:
    rt = await populated(open_runtime)
    console = Console(page_size=2)
    async with serving(rt, authenticate=by_role, authorize=operators, console=console) as srv:
        c = srv.client
        page = (await c.get("/console/api/sessions", headers=VIEWER)).json()
        assert [s["session_id"] for s in page["sessions"]] == ["s-other", "s-done"]
        rest = (
            await c.get("/console/api/sessions", params={"after": page["next"]}, headers=VIEWER)
        ).json()
        assert [s["session_id"] for s in rest["sessions"]] == ["s-fail", "s-park"]
        got = await c.get("/console/api/sessions", params={"status": "parked"}, headers=VIEWER)
        assert [s["session_id"] for s in got.json()["sessions"]] == ["s-park"]
        got = await c.get("/console/api/sessions", params={"agent": "other"}, headers=VIEWER)
        assert [s["session_id"] for s in got.json()["sessions"]] == ["s-other"]
        got = await c.get("/console/api/sessions", params={"older_than": 3600}, headers=VIEWER)
        assert got.json()["sessions"] == []
        got = await c.get("/console/api/sessions", params={"newer_than": 3600}, headers=VIEWER)
        assert len(got.json()["sessions"]) == 2  # one page
        bad = await c.get("/console/api/sessions", params={"status": "asleep"}, headers=VIEWER)
        assert bad.status_code == 400 and "status must be one of" in bad.json()["error"]
        # Authenticated by the app's authenticate; a stranger's rows are filtered out.
        assert (await c.get("/console/api/sessions")).status_code == 401
        nobody = {"X-User": "eve", "X-Role": "none"}
        assert (await c.get("/console/api/sessions", headers=nobody)).json()["sessions"] == []
        page = await c.get("/console/", headers=VIEWER)
        assert page.status_code == 200 and "turnkit console" in page.text


async def test_a_turns_timeline_and_live_counts(open_runtime: Any) -> None:
    rt = await populated(open_runtime)
    async with serving(rt, authenticate=by_role, authorize=operators, console=Console()) as srv:
        c = srv.client
        detail = (await c.get("/console/api/sessions/s-park", headers=VIEWER)).json()
        (turn,) = detail["turns"]
        assert turn["status"] == "suspended"
        assert [p["id"] for p in turn["pending"]] == ["approve"]
        kinds = [(i["kind"], i["label"]) for i in turn["timeline"]]
        assert kinds == [
            ("model", "model → deploy"),
            ("tool", "deploy"),
            ("park", "waiting for approve"),
        ]
        assert turn["timeline"][0]["end"] >= turn["timeline"][0]["start"]
        assert turn["timeline"][2]["end"] is None  # still waiting
        assert [m["role"] for m in detail["messages"]] == ["user", "assistant"]

        failed = (await c.get("/console/api/sessions/s-fail", headers=VIEWER)).json()
        (turn,) = failed["turns"]
        assert turn["status"] == "failed" and "locked down" in turn["error"]
        assert turn["timeline"][-1]["label"] == "failed"
        assert "locked down" in turn["timeline"][-1]["error"]

        live = (await c.get("/console/api/live", headers=VIEWER)).json()
        assert (live["queued"], live["running"], live["parked"]) == (0, 0, 1)
        missing = await c.get("/console/api/sessions/nope", headers=VIEWER)
        assert missing.status_code == 404


async def test_actions_are_authorized_audited_and_act(open_runtime: Any) -> None:
    rt = await populated(open_runtime)
    audited: list[ConsoleAudit] = []
    console = Console(audit=audited.append)
    async with serving(rt, authenticate=by_role, authorize=operators, console=console) as srv:
        c = srv.client
        park = (await rt.session("ops", "s-park").pending_all())[0]
        turn_id = (await rt.store.session("s-park").unfinished())[0].turn_id
        answer = {"turn_id": turn_id, "input_id": park.id, "value": True}

        refused = await c.post("/console/api/sessions/s-park/answer", json=answer, headers=VIEWER)
        assert refused.status_code == 404
        assert await rt.session("ops", "s-park").status() == "suspended"
        done = await c.post("/console/api/sessions/s-park/answer", json=answer, headers=OPERATOR)
        assert done.status_code == 200, done.text
        result = await rt.session("ops", "s-park").result(turn_id)
        assert result.text == "done: deployed"
        events = await rt.session("ops", "s-park").events(turn_id=turn_id)
        assert [e.by for e in events if isinstance(e, turnkit.InputAnsweredEvent)] == ["olga"]

        # Retry the failed turn once the cause is fixed: from its last committed step.
        failed = (await rt.store.session("s-fail").load(from_index=0)).messages[0].turn_id
        FIXED["db"] = True
        model_calls = len(rt.agents["ops"].model.calls)  # type: ignore[attr-defined]
        retry = await c.post(
            "/console/api/sessions/s-fail/retry", json={"turn_id": failed}, headers=OPERATOR
        )
        assert retry.status_code == 200, retry.text
        assert (await rt.session("ops", "s-fail").result(failed)).text == "done: deployed"
        # The model step before the failed tool step was not asked again.
        assert len(rt.agents["ops"].model.calls) == model_calls + 1  # type: ignore[attr-defined]
        again = await c.post(
            "/console/api/sessions/s-fail/retry", json={"turn_id": failed}, headers=OPERATOR
        )
        assert again.status_code == 409 and "only a failed turn" in again.json()["error"]

        reset = await c.post("/console/api/sessions/s-done/reset", headers=OPERATOR)
        assert reset.json() == {"archived_generation": 0}
        erase = await c.post("/console/api/sessions/s-other/erase", headers=OPERATOR)
        assert erase.status_code == 200
        assert await rt.session("other", "s-other").messages() == []
        cancel = await c.post("/console/api/sessions/s-done/cancel", headers=OPERATOR)
        assert cancel.json() == {"cancelled": []}
        unknown = await c.post("/console/api/sessions/s-done/explode", headers=OPERATOR)
        assert unknown.status_code == 404

    trail = [(a.principal, a.action, a.session_id, a.allowed, a.outcome) for a in audited]
    assert trail == [
        ("vic", "answer", "s-park", False, "refused"),
        ("olga", "answer", "s-park", True, "done"),
        ("olga", "retry", "s-fail", True, "done"),
        (
            "olga",
            "retry",
            "s-fail",
            True,
            f"conflict: only a failed turn is retried; turn {failed} is completed",
        ),
        ("olga", "reset", "s-done", True, "done"),
        ("olga", "erase", "s-other", True, "done"),
        ("olga", "cancel", "s-done", True, "done"),
    ]
    assert audited[1].detail == {"turn_id": turn_id, "input_id": park.id}
    assert all(time.time() - a.at < 60 for a in audited)


def test_console_options_are_checked() -> None:
    with pytest.raises(turnkit.ConfigurationError, match="must start with /"):
        Console(path="console")
    with pytest.raises(turnkit.ConfigurationError, match="page_size must be 1 to 500"):
        Console(page_size=0)


async def test_fork_from_the_console(open_runtime: Any) -> None:
    rt = await populated(open_runtime)
    audited: list[ConsoleAudit] = []
    console = Console(audit=audited.append)
    async with serving(rt, authenticate=by_role, authorize=operators, console=console) as srv:
        c = srv.client
        body = {"at": "model:1", "new_session": "s-done-2"}
        refused = await c.post("/console/api/sessions/s-done/fork", json=body, headers=VIEWER)
        assert refused.status_code == 403  # may read it, may not open a session
        made = await c.post("/console/api/sessions/s-done/fork", json=body, headers=OPERATOR)
        assert made.json() == {"session_id": "s-done-2", "at": 1, "status": "running"}
        fork = rt.session("ops", "s-done-2")
        turn_id = (await fork.messages())[0].turn_id
        # Carried on in this process (it runs turns): the model is asked again.
        assert (await fork.result(turn_id)).text == "done: deployed"
        whole = await c.post(
            "/console/api/sessions/s-park/fork", json={"new_session": "s-park-2"}, headers=OPERATOR
        )
        assert whole.json()["status"] == "suspended"
        bad = await c.post(
            "/console/api/sessions/s-done/fork",
            json={"at": "model:9", "new_session": "x"},
            headers=OPERATOR,
        )
        assert bad.status_code == 409 and "no model step 'model:9'" in bad.json()["error"]
    assert [(a.principal, a.action, a.outcome[:8]) for a in audited] == [
        ("vic", "fork", "refused:"),
        ("olga", "fork", "done"),
        ("olga", "fork", "done"),
        ("olga", "fork", "conflict"),
    ]


async def test_on_an_http_node_retry_and_fork_go_to_the_workers(
    pg_dsn: str, pg_schema: str
) -> None:
    """On an HTTP node (a ``RuntimeClient``) the console stores a retried turn (and a
    fork's cut turn) ``running``, and a worker of the deployment claims and finishes it."""
    from turnkit.stores import PostgresStore

    FIXED["db"] = False
    node_store = PostgresStore(pg_dsn, schema=pg_schema)
    worker_store = PostgresStore(pg_dsn, schema=pg_schema)
    async with (
        turnkit.Runtime([ops_agent()], store=worker_store) as workers,
        turnkit.RuntimeClient([ops_agent()], store=node_store) as node,
    ):
        worker = turnkit.Worker(workers, poll=0.05)
        running = asyncio.create_task(worker.run())
        try:
            session = node.session("ops", "s-fail")
            turn_id = await session.submit("db")
            assert (await session.result(turn_id)).status == "failed"
            FIXED["db"] = True
            async with serving(
                node, authenticate=by_role, authorize=operators, console=Console()
            ) as srv:
                retry = await srv.client.post(
                    "/console/api/sessions/s-fail/retry",
                    json={"turn_id": turn_id},
                    headers=OPERATOR,
                )
                assert retry.status_code == 200, retry.text
                assert (await session.result(turn_id)).text == "done: deployed"
                made = await srv.client.post(
                    "/console/api/sessions/s-fail/fork",
                    json={"at": 2, "new_session": "s-fail-2"},
                    headers=OPERATOR,
                )
                assert made.json()["status"] == "running"
                fork = node.session("ops", "s-fail-2")
                assert (await fork.result(turn_id)).text == "done: deployed"
        finally:
            worker.stop()
            await asyncio.wait_for(running, timeout=30)
