"""``turnkit.mcp.server``: the official SDK's client against turnkit's MCP endpoint,
mounted by ``create_app`` and served by hypercorn on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from server_support import by_header, serve_app
from starlette.requests import Request

import turnkit
from turnkit.mcp import server
from turnkit.server import Authenticate, Principal, create_app
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def make_agent() -> turnkit.Agent:
    def lookup(data: dict[str, Any], actx: turnkit.ActionContext) -> dict[str, Any]:
        if data["order"] == "0":
            raise LookupError("no order 0")
        return {"order": data["order"], "by": actx.user.id if actx.user else None}

    async def ping(data: dict[str, Any], actx: turnkit.ActionContext) -> str:
        return "pong"

    lookup_order = turnkit.define_action(
        name="lookup_order",
        description="Find an order by its number.",
        input_schema={
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
        },
        run=lookup,
    )
    pinger = turnkit.define_action(
        name="ping", description="Answers pong.", input_schema={"type": "object"}, run=ping
    )

    @turnkit.tool
    async def ship(ctx: turnkit.ToolContext) -> str:
        """Ship, once a person says yes."""
        ok = await ctx.request_input("ok", "Ship it?", schema={"type": "boolean"})
        return "shipped" if ok else "kept"

    def respond(transcript: Any) -> ScriptedReply | str:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage) and last.text == "ship":
            return ScriptedReply(tool_calls=[tool_call("ship")])
        if isinstance(last, turnkit.ToolMessage):
            return f"Result: {last.result}"
        return f"You said: {last.text}"

    return turnkit.Agent(
        name="helper",
        model=ScriptedModel(respond=respond),
        instructions="Help.",
        tools=[lookup_order, pinger, ship],
    )


@asynccontextmanager
async def serving(tmp_path: Path, authenticate: Authenticate = by_header) -> AsyncIterator[str]:
    """turnkit's app with the MCP endpoint on a free loopback port; yields its base URL."""
    agent = make_agent()
    async with turnkit.Runtime([agent], store=SqliteStore(tmp_path / "t.db")) as runtime:
        app = create_app(
            runtime, authenticate=authenticate, mcp=server(runtime, agent, agent_tool=True)
        )
        # The lifespan runs the MCP endpoint's session manager.
        async with serve_app(app, lifespan=True) as url:
            yield url


@asynccontextmanager
async def client_as(url: str, user: str | None) -> AsyncIterator[Client]:
    headers = {"x-user": user} if user else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        transport = streamable_http_client(f"{url}/mcp", http_client=http)
        async with Client(transport, cache=None) as client:
            yield client


async def test_the_sdk_client_lists_calls_actions_and_runs_the_agent(tmp_path: Path) -> None:
    async with serving(tmp_path) as url, client_as(url, "alice") as alice:
        listed = {t.name: t for t in (await alice.list_tools()).tools}
        # Actions and the agent; never a tool that sees the store (ship).
        assert set(listed) == {"lookup_order", "ping", "helper", "helper_resume"}
        assert listed["lookup_order"].description == "Find an order by its number."
        assert listed["lookup_order"].input_schema["required"] == ["order"]

        found = await alice.call_tool("lookup_order", {"order": "42"})
        assert not found.is_error and found.structured_content == {"order": "42", "by": "alice"}
        assert (await alice.call_tool("ping", {})).content[0].text == "pong"  # type: ignore[union-attr]
        missing = await alice.call_tool("lookup_order", {"order": "0"})
        assert missing.is_error and "no order 0" in missing.content[0].text  # type: ignore[union-attr]
        bad = await alice.call_tool("lookup_order", {"order": 7})
        assert bad.is_error and "invalid input" in bad.content[0].text  # type: ignore[union-attr]

        first = await alice.call_tool("helper", {"message": "hello"})
        assert not first.is_error and first.content[0].text == "You said: hello"  # type: ignore[union-attr]
        session = first.structured_content["session"]  # type: ignore[index]
        again = await alice.call_tool("helper", {"message": "more", "session": session})
        assert again.structured_content["text"] == "You said: more"  # type: ignore[index]

    async with serving(tmp_path) as url, client_as(url, "bob") as bob:
        # Alice's session is hers alone (owner_only): to bob it does not exist.
        theirs = await bob.call_tool("helper", {"message": "hi", "session": session})
        assert theirs.is_error
        assert f"no session {session!r} for you" in theirs.content[0].text  # type: ignore[union-attr]


async def test_a_parked_turn_answers_with_its_question_and_how_to_resume(tmp_path: Path) -> None:
    async with serving(tmp_path) as url, client_as(url, "alice") as alice:
        parked = await alice.call_tool("helper", {"message": "ship"})
        assert not parked.is_error
        text = parked.content[0].text  # type: ignore[union-attr]
        assert "Ship it?" in text and "helper_resume" in text
        how = parked.structured_content["resume"]  # type: ignore[index]
        assert how["tool"] == "helper_resume"
        arguments = {**how["arguments"], "value": True}
        busy = await alice.call_tool(
            "helper", {"message": "hello?", "session": arguments["session"]}
        )
        assert "still waiting" in busy.content[0].text  # type: ignore[union-attr]
        wrong = await alice.call_tool("helper_resume", {**arguments, "value": "yes"})
        assert wrong.is_error
        done = await alice.call_tool("helper_resume", arguments)
        assert not done.is_error
        assert done.content[0].text == "Result: shipped"  # type: ignore[union-attr]


def with_former_name(request: Request) -> Principal | None:
    """``x-user: ann`` is ``local:ann``, who went by ``cli:ann`` before."""
    user = request.headers.get("x-user")
    return Principal(id=f"local:{user}", aliases=(f"cli:{user}",)) if user else None


async def test_a_question_parked_for_an_alias_is_answered_under_it(tmp_path: Path) -> None:
    """A principal's alias names them as an answerer over MCP as over HTTP, and the
    answer is recorded under the name the question asked for."""
    async with turnkit.Runtime([make_agent()], store=SqliteStore(tmp_path / "t.db")) as runtime:
        session = runtime.session("helper", "old")
        event = turnkit.InboundEvent(
            source="cli", text="ship", user=turnkit.User(id="cli:ann", attested=True)
        )
        turn_id = await session.submit("ship", event=event, owner="cli:ann")
        assert (await session.result(turn_id)).status == "suspended"
    arguments = {"session": "old", "turn_id": turn_id, "input_id": "ok", "value": True}
    async with serving(tmp_path, with_former_name) as url, client_as(url, "ann") as ann:
        done = await ann.call_tool("helper_resume", arguments)
        assert not done.is_error, done.content
        assert done.content[0].text == "Result: shipped"  # type: ignore[union-attr]
    store = SqliteStore(tmp_path / "t.db")
    await store.open()
    try:
        events = await store.session("old").events()
    finally:
        await store.close()
    assert [e.by for e in events if isinstance(e, turnkit.InputAnsweredEvent)] == ["cli:ann"]


async def test_the_endpoint_refuses_a_caller_without_credentials(tmp_path: Path) -> None:
    async with serving(tmp_path) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            refused = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert refused.status_code == 401
        assert refused.json()["code"] == "unauthenticated"
        with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises, it connects not
            async with client_as(url, None) as nobody:
                await nobody.list_tools()


# -- issue 27 item 3: sessions belong to their principal, and each has a share ----------


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def open_raw(client: httpx.AsyncClient, user: str) -> str:
    reply = await client.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "X-User": user})
    assert reply.status_code == 200, reply.text
    return reply.headers["mcp-session-id"]


async def list_raw(client: httpx.AsyncClient, user: str, session: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    headers = {**MCP_HEADERS, "X-User": user, "mcp-session-id": session}
    return await client.post("/mcp", json=body, headers=headers)


async def test_item3_a_session_is_its_openers_and_each_principal_has_a_share(
    tmp_path: Path,
) -> None:
    from turnkit.mcp import McpLimits

    agent = make_agent()
    async with turnkit.Runtime([agent], store=SqliteStore(tmp_path / "t.db")) as runtime:
        endpoint = server(runtime, agent, limits=McpLimits(per_principal=3, total=50))
        app = create_app(runtime, authenticate=by_header, mcp=endpoint)
        async with (
            serve_app(app, lifespan=True) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            # Alice opens far more sessions than her share: only her newest three
            # live, and the table never holds more of hers.
            opened = [await open_raw(client, "alice") for _ in range(40)]
            gone = await list_raw(client, "alice", opened[0])
            assert gone.status_code == 404
            assert (await list_raw(client, "alice", opened[-1])).status_code == 200
            # Bob is not locked out: the SDK's own client initializes and works.
            async with client_as(url, "bob") as bob:
                assert (await bob.list_tools()).tools
            # Bob holding alice's session id can neither use it nor end it.
            used = await list_raw(client, "bob", opened[-1])
            missing = await list_raw(client, "bob", "no-such-session")
            assert used.status_code == missing.status_code == 404
            assert used.json() == missing.json()
            ended = await client.delete(
                "/mcp", headers={"X-User": "bob", "mcp-session-id": opened[-1]}
            )
            assert ended.status_code == 404
            assert (await list_raw(client, "alice", opened[-1])).status_code == 200
            # Alice ends her own.
            mine = await client.delete(
                "/mcp", headers={"X-User": "alice", "mcp-session-id": opened[-1]}
            )
            assert mine.status_code == 200
            assert (await list_raw(client, "alice", opened[-1])).status_code == 404


def test_a_decision_is_explained_to_an_mcp_client() -> None:
    from turnkit.mcp._agent_tool import answer_shape

    options = turnkit.DecisionOptions(allowed=("approve", "reject"), arguments={"order": "A-1"})
    request = turnkit.InputRequest(
        id="q", prompt="?", turn_id="t", call_id="c", tool="ship", kind="decision", decision=options
    )
    assert answer_shape(request) == (
        ' It is a decision on a proposed call to ship with the arguments {"order": "A-1"}; '
        'the value is one of {"decision": "approve"} or {"decision": "reject", "reason": "..."}.'
    )
    plain = turnkit.InputRequest(id="q", prompt="?", turn_id="t", call_id="c", tool="x")
    assert answer_shape(plain) == ""
