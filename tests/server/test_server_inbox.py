"""``GET /inbox`` over HTTP: the caller's open questions across sessions and agents,
honouring answerers, ``authorize_answer`` and ``authorize``; paged by a cursor."""

from __future__ import annotations

from typing import Any

from server_support import Served, serving
from starlette.requests import Request

import turnkit
from turnkit import AnswerCheck, Answerers, ToolContext, UserMessage, tool
from turnkit.server import Principal, SessionAccess, owner_only
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def asking_agent(name: str) -> turnkit.Agent:
    """A turn's text names who its question is for: ``user:bo``, ``policy:leads``,
    ``anyone``, or ``me`` (the speaker, the default answerer)."""

    @tool
    async def ask(who: str, ctx: ToolContext) -> str:
        """Ask someone."""
        kind, _, target = who.partition(":")
        answerers = (
            Answerers.user(target)
            if kind == "user"
            else Answerers.policy(target)
            if kind == "policy"
            else None
        )
        if kind == "anyone":
            answerers = None
        answer = await ctx.request_input("q", f"for {who}", answerers=answerers)
        return f"got {answer}"

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("ask", {"who": last.text})])
        return "done"

    async def leads(check: AnswerCheck) -> bool:
        return check.policy == "leads" and "lead" in check.principal.claims.get("roles", ())

    return turnkit.Agent(
        name=name, model=ScriptedModel(respond=respond), tools=[ask], authorize_answer=leads
    )


def by_header(request: Request) -> Principal | None:
    user = request.headers.get("x-user")
    roles = tuple(filter(None, request.headers.get("x-roles", "").split(",")))
    return Principal(id=user, claims={"roles": roles}) if user else None


def admins_too(principal: Principal, access: SessionAccess) -> bool:
    return principal.id == "root" or owner_only(principal, access)


async def ask(served: Served, agent: str, session: str, who: str, user: str = "alice") -> None:
    reply = await served.client.post(
        served.path(agent, session, "chat"), json={"text": who}, headers={"X-User": user}
    )
    assert reply.status_code == 200 and reply.json()["status"] == "suspended", reply.text


async def inbox(served: Served, user: str, **params: Any) -> Any:
    headers = {"X-User": user, "X-Roles": params.pop("roles", "")}
    reply = await served.client.get("/inbox", params=params, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()


def where(body: Any) -> list[tuple[str, str]]:
    return [(i["agent"], i["session_id"]) for i in body["items"]]


async def test_the_inbox_honours_answerers_grants_and_authorize(open_runtime: Any) -> None:
    runtime = await open_runtime(asking_agent("a"), asking_agent("b"))
    async with serving(runtime, authenticate=by_header, authorize=admins_too) as served:
        await ask(served, "a", "s1", "me")  # alice's own question
        await ask(served, "b", "s2", "user:bo")  # alice's session, bo's question
        await ask(served, "a", "s3", "policy:leads")
        s4 = runtime.session("b", "s4")  # opened from code: owned by nobody
        assert (await s4.result(s4.start("anyone"))).status == "suspended"

        alice = await inbox(served, "alice")
        assert where(alice) == [("a", "s1")] and alice["next"] is None
        (item,) = alice["items"]
        assert item["answer_as"] == "alice" and item["request"]["prompt"] == "for me"
        assert item["turn_id"] == item["request"]["turn_id"] and item["age_seconds"] >= 0
        # bo may answer a question in a session he may not read.
        assert where(await inbox(served, "bo")) == [("b", "s2")]
        assert where(await inbox(served, "cy", roles="lead")) == [("a", "s3")]
        assert where(await inbox(served, "cy")) == []
        # A question naming nobody: only for those authorize lets resume its session.
        assert where(await inbox(served, "root")) == [("b", "s4")]

        # Answering from the inbox is an ordinary resume.
        (bos,) = (await inbox(served, "bo"))["items"]
        answered = await served.client.post(
            served.path(bos["agent"], bos["session_id"], "resume"),
            json={"turn_id": bos["turn_id"], "input_id": bos["request"]["id"], "value": "ok"},
            headers={"X-User": "bo"},
        )
        assert answered.json()["status"] == "accepted", answered.text
        assert where(await inbox(served, "bo")) == []


async def test_the_inbox_pages_with_a_cursor(open_runtime: Any) -> None:
    runtime = await open_runtime(asking_agent("a"))
    async with serving(runtime, authenticate=by_header) as served:
        for n in range(5):
            await ask(served, "a", f"s{n}", "user:bo")
        seen: list[tuple[str, str]] = []
        body = await inbox(served, "bo", limit=2)
        seen += where(body)
        while body["next"] is not None:
            body = await inbox(served, "bo", limit=2, after=body["next"])
            seen += where(body)
        assert seen == [("a", f"s{n}") for n in range(5)]


async def test_bad_inbox_requests_are_refused(open_runtime: Any) -> None:
    runtime = await open_runtime(asking_agent("a"))
    async with serving(runtime, authenticate=by_header) as served:
        for params, problem in [
            ({"limit": "0"}, "limit must be between 1 and"),
            ({"limit": "x"}, "limit must be a non-negative integer"),
            ({"after": "zz"}, "not an inbox cursor"),
        ]:
            reply = await served.client.get("/inbox", params=params, headers={"X-User": "a"})
            assert reply.status_code == 400, reply.text
            assert problem in reply.json()["error"]
        assert (await served.client.get("/inbox")).status_code == 401
