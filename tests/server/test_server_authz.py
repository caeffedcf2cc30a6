"""Whose sessions a caller may use over HTTP: two principals against every route,
allowed and refused, with the whole SQLite store dumped before and after each
refusal; ``authorize`` hooks that open more up; the JSON depth limit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import Served, dump, serving
from starlette.requests import Request

import turnkit
from turnkit import Answerers, ToolContext, tool
from turnkit.server import Principal, ServerLimits, SessionAccess, owner_only
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

ALICE = {"X-User": "alice"}
BOB = {"X-User": "bob"}
BOOLEAN = {"type": "boolean"}


def shop_agent() -> turnkit.Agent:
    """``shop``: "refund" parks for the opener's approval (naming nobody in a turn
    started from code), "ask carol" parks for carol; anything else is answered."""

    @tool
    async def refund(who: str, ctx: ToolContext) -> str:
        """Asks before refunding."""
        answerers = Answerers.user("carol") if who == "carol" else None
        ok = await ctx.request_input("approve", "Refund?", schema=BOOLEAN, answerers=answerers)
        return "refunded" if ok else "declined"

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage):
            if last.text == "refund":
                return ScriptedReply(tool_calls=[tool_call("refund", {"who": "opener"})])
            if last.text.startswith("ask "):
                who = last.text.removeprefix("ask ")
                return ScriptedReply(tool_calls=[tool_call("refund", {"who": who})])
            return ScriptedReply(text=f"you said {last.text}")
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(text=f"The refund was {last.result}.")

    return turnkit.Agent(
        name="shop", model=ScriptedModel(respond=respond), instructions=".", tools=[refund]
    )


def with_claims(request: Request) -> Principal | None:
    user = request.headers.get("x-user")
    role = request.headers.get("x-role", "")
    return Principal(id=user, claims={"role": role}) if user else None


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[turnkit.Runtime]:
    async with turnkit.Runtime([shop_agent()], store=SqliteStore(tmp_path / "t.db")) as rt:
        yield rt


def db_of(runtime: turnkit.Runtime) -> Path:
    store = runtime.store
    assert isinstance(store, SqliteStore)
    return Path(store.path)


async def park(served: Served, session: str, text: str = "refund") -> str:
    reply = await served.client.post(
        served.path("shop", session, "chat"), json={"text": text}, headers=ALICE
    )
    assert reply.json()["status"] == "suspended", reply.text
    return str(reply.json()["turn_id"])


def missing(session: str) -> dict[str, str]:
    return {"error": f"agent 'shop' has no session {session!r} for you", "code": "unknown_session"}


async def test_another_owners_session_is_a_missing_one_on_every_route(
    runtime: turnkit.Runtime,
) -> None:
    await runtime.session("shop", "code").turn("from code")  # nobody's
    async with serving(runtime) as served:
        turn_id = await park(served, "mine")
        requests: list[tuple[str, str, dict[str, Any] | None, dict[str, str] | None]] = [
            ("GET", "transcript", None, None),
            ("GET", "transcript", None, {"events": "true"}),
            ("GET", "transcript", None, {"generation": "0"}),
            ("GET", "pending", None, None),
            ("GET", "events", None, None),
            ("GET", "events", None, {"turn_id": turn_id}),
            ("HEAD", "events", None, None),
            ("POST", "turns", {"text": "hi"}, None),
            ("POST", "turns", {"text": "x", "turn_id": turn_id}, None),  # a replay of alice's
            ("POST", "chat", {"text": "hi"}, None),
            ("POST", "chat", {"text": "hi", "replace": True}, None),
            ("POST", "resume", {"turn_id": turn_id, "input_id": "approve", "value": True}, None),
            ("POST", "resume", {"turn_id": "t", "input_id": "i", "value": None}, None),
            ("POST", "reset", None, None),
            ("POST", "cancel", None, None),
            ("POST", "wake", None, None),
            ("POST", "wake", {"turn_id": turn_id}, None),
        ]
        before = dump(db_of(runtime))
        for session in ("mine", "code", "ghost"):
            for method, verb, body, params in requests:
                if session == "ghost" and verb in ("turns", "chat"):
                    continue  # a new session: anyone may open one (checked below)
                reply = await served.client.request(
                    method,
                    served.path("shop", session, verb),
                    json=body,
                    params=params,
                    headers=BOB,
                )
                where = (session, method, verb, body, params)
                assert reply.status_code == 404, (where, reply.text)
                if method != "HEAD":
                    # The same answer as for a session that does not exist: no leak.
                    assert reply.json() == missing(session), (where, reply.text)
                assert dump(db_of(runtime)) == before, where
        # Bob sees none of it listed; alice sees her own session only.
        listed = await served.client.get("/agents/shop/sessions", headers=BOB)
        assert listed.json()["sessions"] == []
        mine = (await served.client.get("/agents/shop/sessions", headers=ALICE)).json()
        assert [row["session_id"] for row in mine["sessions"]] == ["mine"]
        # Alice, the owner, is allowed every one of those routes.
        for method, verb, params in [
            ("GET", "transcript", {"events": "true"}),
            ("GET", "pending", None),
            ("HEAD", "events", None),
        ]:
            reply = await served.client.request(
                method, served.path("shop", "mine", verb), params=params, headers=ALICE
            )
            assert reply.status_code == 200, (verb, reply.text)
        pending = await served.client.get(served.path("shop", "mine", "pending"), headers=ALICE)
        assert pending.json()["request"]["turn_id"] == turn_id
        done = await served.client.post(
            served.path("shop", "mine", "resume"),
            json={"turn_id": turn_id, "input_id": "approve", "value": True},
            headers={**ALICE, "Accept": "application/json"},
        )
        assert done.status_code == 200, done.text
        assert (await runtime.session("shop", "mine").result(turn_id)).status == "completed"
        again = await served.client.post(
            served.path("shop", "mine", "chat"), json={"text": "thanks"}, headers=ALICE
        )
        assert again.json()["text"] == "you said thanks"
        reset = await served.client.post(served.path("shop", "mine", "reset"), headers=ALICE)
        assert reset.status_code == 200 and reset.json()["archived_generation"] == 0
        # Bob may open a session of his own, which then is his and not alice's.
        opened = await served.client.post(
            served.path("shop", "ghost", "chat"), json={"text": "mine now"}, headers=BOB
        )
        assert opened.json()["text"] == "you said mine now"
        theirs = await served.client.get(served.path("shop", "ghost", "transcript"), headers=ALICE)
        assert theirs.status_code == 404 and theirs.json() == missing("ghost")
    owners = {i.session_id: i.owner for i in await runtime.sessions()}
    assert owners == {"code": None, "mine": "alice", "ghost": "bob"}


async def test_two_first_turns_racing_for_a_new_session_give_it_one_owner(
    runtime: turnkit.Runtime,
) -> None:
    async with serving(runtime) as served:
        url = served.path("shop", "race", "chat")
        replies = await asyncio.gather(
            *(
                served.client.post(url, json={"text": f"from {who}"}, headers={"X-User": who})
                for who in ("alice", "bob", "alice", "bob")
            )
        )
    (info,) = await runtime.sessions()
    assert info.owner in ("alice", "bob")
    for who, reply in zip(("alice", "bob", "alice", "bob"), replies, strict=True):
        if who == info.owner:
            assert reply.status_code == 200 and reply.json()["status"] == "completed"
        else:
            assert reply.status_code == 404 and reply.json() == missing("race"), reply.text
    texts = [m.text for m in await runtime.session("shop", "race").messages()]
    assert texts == [f"from {info.owner}", f"you said from {info.owner}"] * 2


async def test_an_authorize_hook_opens_sessions_up_and_sees_every_access(
    runtime: turnkit.Runtime,
) -> None:
    seen: list[SessionAccess] = []

    async def admins_read_everything(principal: Principal, access: SessionAccess) -> bool:
        seen.append(access)
        if principal.claims.get("role") == "admin" and access.action in ("read", "list"):
            return True
        if access.session_id.startswith("team-") and access.action != "reset":
            return True  # a shared team session: anyone may talk in it
        return owner_only(principal, access)

    await runtime.session("shop", "code").turn("from code")
    async with serving(runtime, authenticate=with_claims, authorize=admins_read_everything) as s:
        await park(s, "mine")
        admin = {"X-User": "root", "X-Role": "admin"}
        listed = (await s.client.get("/agents/shop/sessions", headers=admin)).json()
        assert sorted(row["session_id"] for row in listed["sessions"]) == ["code", "mine"]
        transcript = await s.client.get(s.path("shop", "mine", "transcript"), headers=admin)
        assert transcript.json()["messages"][0]["text"] == "refund"
        before = dump(db_of(runtime))
        refused = await s.client.post(s.path("shop", "mine", "reset"), headers=admin)
        assert refused.status_code == 404 and refused.json() == missing("mine")
        refused = await s.client.post(
            s.path("shop", "mine", "chat"), json={"text": "hi"}, headers=admin
        )
        assert refused.status_code == 404 and dump(db_of(runtime)) == before
        # A team session that alice opened: bob talks in it too, and it stays alice's.
        first = await s.client.post(
            s.path("shop", "team-1", "chat"), json={"text": "hello"}, headers=ALICE
        )
        assert first.json()["status"] == "completed"
        second = await s.client.post(
            s.path("shop", "team-1", "chat"), json={"text": "hi all"}, headers=BOB
        )
        assert second.json()["text"] == "you said hi all", second.text
        bob_reset = await s.client.post(s.path("shop", "team-1", "reset"), headers=BOB)
        assert bob_reset.status_code == 404
    assert {i.session_id: i.owner for i in await runtime.sessions()}["team-1"] == "alice"
    reads = [a for a in seen if a.session_id == "mine" and a.action == "read"]
    assert reads and reads[0] == SessionAccess(
        agent="shop", session_id="mine", owner="alice", action="read", exists=True
    )
    new = next(a for a in seen if a.session_id == "team-1")
    assert new.action == "turn" and not new.exists and new.owner is None
    assert {a.action for a in seen} == {"read", "turn", "reset", "list"}


async def test_an_authorize_that_fails_or_answers_no_bool_is_a_500_that_changes_nothing(
    runtime: turnkit.Runtime,
) -> None:
    def broken(principal: Principal, access: SessionAccess) -> Any:
        if access.session_id == "raises":
            raise ConnectionError("ldap://directory.internal is down")
        return "yes"

    async with serving(runtime, authorize=broken) as served:
        before = dump(db_of(runtime))
        for session in ("raises", "truthy"):
            reply = await served.client.post(
                served.path("shop", session, "chat"), json={"text": "hi"}, headers=ALICE
            )
            assert reply.status_code == 500 and reply.json()["code"] == "internal_error"
            assert "directory" not in reply.text
        assert dump(db_of(runtime)) == before


async def test_a_park_naming_nobody_is_resumed_only_by_who_may_resume(
    runtime: turnkit.Runtime,
) -> None:
    def readers(principal: Principal, access: SessionAccess) -> bool:
        if principal.id == "bob" and access.action == "read":
            return True  # bob may look, but not answer
        return owner_only(principal, access) or (
            principal.id == "dana" and access.action == "resume"
        )

    # Started from code, so no speaker: the request names nobody.
    session = runtime.session("shop", "s1")
    turn_id = session.start("refund", owner="alice")
    assert (await session.result(turn_id)).status == "suspended"
    async with serving(runtime, authorize=readers) as served:
        pending = await served.client.get(served.path("shop", "s1", "pending"), headers=BOB)
        assert pending.json()["request"]["answerers"] == []
        body = {"turn_id": turn_id, "input_id": "approve", "value": True}
        before = dump(db_of(runtime))
        refused = await served.client.post(
            served.path("shop", "s1", "resume"), json=body, headers=BOB
        )
        assert refused.status_code == 404 and refused.json() == missing("s1")
        assert dump(db_of(runtime)) == before
        done = await served.client.post(
            served.path("shop", "s1", "resume"), json=body, headers={"X-User": "dana"}
        )
        assert done.status_code == 200, done.text
    assert (await runtime.session("shop", "s1").result(turn_id)).status == "completed"


async def test_a_named_answerer_resumes_a_session_they_cannot_otherwise_see(
    runtime: turnkit.Runtime,
) -> None:
    carol = {"X-User": "carol"}
    async with serving(runtime) as served:
        turn_id = await park(served, "s1", "ask carol")
        pending = await served.client.get(served.path("shop", "s1", "pending"), headers=carol)
        assert pending.status_code == 404  # carol may answer, not read
        before = dump(db_of(runtime))
        url = served.path("shop", "s1", "resume")
        for headers, body in [
            (BOB, {"turn_id": turn_id, "input_id": "approve", "value": True}),
            (carol, {"turn_id": turn_id, "input_id": "other", "value": True}),
            (carol, {"turn_id": "other", "input_id": "approve", "value": True}),
            (carol, {"turn_id": turn_id, "input_id": "approve", "value": "yes"}),
        ]:
            refused = await served.client.post(url, json=body, headers=headers)
            assert refused.status_code == 404 and refused.json() == missing("s1"), body
            assert dump(db_of(runtime)) == before
        # Alice owns the session but is not named: the request's answerers decide.
        owner = await served.client.post(
            url, json={"turn_id": turn_id, "input_id": "approve", "value": True}, headers=ALICE
        )
        assert owner.status_code == 403 and owner.json()["code"] == "not_an_answerer"
        done = await served.client.post(
            url, json={"turn_id": turn_id, "input_id": "approve", "value": False}, headers=carol
        )
        assert done.status_code == 200, done.text
        # Issue 27 item 9: the outcome of carol's answer, and nothing of the session.
        assert done.json() == {"status": "accepted", "turn_id": turn_id, "input_id": "approve"}
        result = await runtime.session("shop", "s1").result(turn_id)
        assert result.text == "The refund was declined."
        assert "declined" not in done.text and "Refund?" not in done.text
        for verb in ("transcript", "pending", "events"):
            after = await served.client.get(served.path("shop", "s1", verb), headers=carol)
            assert after.status_code == 404 and after.json() == missing("s1"), verb


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


async def test_bodies_nested_too_deep_are_a_400_in_turns_and_resume_values(
    runtime: turnkit.Runtime,
) -> None:
    limits = ServerLimits(max_body_bytes=1_000_000, max_json_depth=64)
    async with serving(runtime, limits=limits) as served:
        turn_id = await park(served, "s1")
        before = dump(db_of(runtime))
        headers = {**ALICE, "Content-Type": "application/json"}
        resume = served.path("shop", "s1", "resume")
        start = f'{{"turn_id": "{turn_id}", "input_id": "approve", "value": '
        for url, content in [
            (served.path("shop", "s2", "chat"), '{"text": "hi", "x": ' + nested(64) + "}"),
            (served.path("shop", "s2", "turns"), nested(1000)),
            (resume, start + nested(64) + "}"),
            (resume, start + nested(1000) + "}"),
            (resume, start + nested(100_000) + "}"),
            (resume, start + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}"),
            (resume, start + "[" * 100_000),  # deep and not even finished
        ]:
            reply = await served.client.post(url, content=content, headers=headers)
            assert reply.status_code == 400, (content[:80], reply.text)
            assert reply.json()["code"] == "too_deep", reply.text
            assert "64" in reply.json()["error"]
        assert dump(db_of(runtime)) == before
        # Brackets inside strings are text, not nesting; 63 levels of value are fine.
        text = json.dumps({"text": "[" * 5000 + '"{' * 100})
        chat = await served.client.post(
            served.path("shop", "s3", "chat"), content=text, headers=headers
        )
        assert chat.status_code == 200 and chat.json()["status"] == "completed", chat.text
        deep_answer = start + nested(63, "true") + "}"
        reply = await served.client.post(resume, content=deep_answer, headers=headers)
        assert reply.status_code == 422 and reply.json()["code"] == "invalid_answer"


def test_a_depth_limit_must_be_a_positive_int() -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(turnkit.ConfigurationError, match="max_json_depth"):
            ServerLimits(max_json_depth=bad)  # type: ignore[arg-type]


# -- Host and Origin -------------------------------------------------------------------


async def test_a_foreign_host_is_a_421_and_a_foreign_origin_may_not_post(
    runtime: turnkit.Runtime,
) -> None:
    async with serving(runtime, allowed_hosts=["127.0.0.1", "chat.example"]) as served:
        port = served.url.rsplit(":", 1)[1]
        before = dump(db_of(runtime))
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}"):
            for method, verb in [("GET", "transcript"), ("POST", "chat")]:
                reply = await served.client.request(
                    method,
                    served.path("shop", "s1", verb),
                    json={"text": "hi"} if method == "POST" else None,
                    headers={**ALICE, "Host": host, "Origin": f"http://{host}"},
                )
                assert reply.status_code == 421, (host, reply.text)
                assert reply.json()["code"] == "misdirected_request"
        for origin in ("http://attacker.example", "null", f"http://localhost:{port}"):
            reply = await served.client.post(
                served.path("shop", "s1", "chat"),
                json={"text": "hi"},
                headers={**ALICE, "Origin": origin},
            )
            assert reply.status_code == 403 and reply.json()["code"] == "cross_origin", origin
            reset = await served.client.post(
                served.path("shop", "s1", "reset"), headers={**ALICE, "Origin": origin}
            )
            assert reset.status_code == 403, origin
        assert dump(db_of(runtime)) == before
        # A GET from another origin changes nothing; the browser keeps its answer from it.
        listed = await served.client.get(
            "/agents/shop/sessions", headers={**ALICE, "Origin": "http://attacker.example"}
        )
        assert listed.status_code == 200
        # The page's own origin, and a listed name, are served.
        for host in (f"127.0.0.1:{port}", f"CHAT.example:{port}"):
            reply = await served.client.post(
                served.path("shop", "s1", "chat"),
                json={"text": "hi"},
                headers={**ALICE, "Host": host, "Origin": f"http://{host.lower()}"},
            )
            assert reply.status_code == 200, (host, reply.text)


async def test_allowed_origins_admit_a_front_end_elsewhere(runtime: turnkit.Runtime) -> None:
    async with serving(runtime, allowed_origins=["https://app.example"]) as served:
        ok = await served.client.post(
            served.path("shop", "s1", "chat"),
            json={"text": "hi"},
            headers={**ALICE, "Origin": "https://app.example", "Host": "api.internal:80"},
        )
        assert ok.status_code == 200, ok.text
        other = await served.client.post(
            served.path("shop", "s1", "chat"),
            json={"text": "hi"},
            headers={**ALICE, "Origin": "https://evil.example"},
        )
        assert other.status_code == 403


def test_allowed_hosts_must_be_names(runtime: turnkit.Runtime) -> None:
    from turnkit.server import create_app

    def nobody(request: Request) -> None:
        return None

    for bad in ("localhost", [""], [3]):
        with pytest.raises(turnkit.ConfigurationError, match="allowed_hosts"):
            create_app(runtime, authenticate=nobody, allowed_hosts=bad)  # type: ignore[arg-type]


async def test_a_stream_answers_as_usual_to_its_owner(runtime: turnkit.Runtime) -> None:
    """The owner's /turns stream is the whole turn, as before owners existed."""
    async with (
        serving(runtime) as served,
        httpx.AsyncClient(base_url=served.url) as client,
        client.stream(
            "POST",
            served.path("shop", "s1", "turns"),
            json={"text": "hello"},
            headers={**ALICE, "Accept": "text/event-stream"},
        ) as reply,
    ):
        assert reply.status_code == 200
        raw = (await reply.aread()).decode()
    assert "turn.completed" in raw and "you said hello" in raw
