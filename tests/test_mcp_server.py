"""``turnkit.mcp.server``: the official SDK's client against turnkit's MCP endpoint,
mounted by ``create_app`` and served by uvicorn on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from server_support import by_header

import turnkit
from turnkit.mcp import server
from turnkit.server import create_app
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
async def serving(tmp_path: Path) -> AsyncIterator[str]:
    """turnkit's app with the MCP endpoint on a free loopback port; yields its base URL."""
    agent = make_agent()
    async with turnkit.Runtime([agent], store=SqliteStore(tmp_path / "t.db")) as runtime:
        app = create_app(
            runtime, authenticate=by_header, mcp=server(runtime, agent, agent_tool=True)
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
        runner = uvicorn.Server(config)
        task = asyncio.create_task(runner.serve(sockets=[sock]))
        while not runner.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            runner.should_exit = True
            await task
            sock.close()


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


async def test_the_endpoint_refuses_a_caller_without_credentials(tmp_path: Path) -> None:
    async with serving(tmp_path) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            refused = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert refused.status_code == 401
        assert refused.json()["code"] == "unauthenticated"
        with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises, it connects not
            async with client_as(url, None) as nobody:
                await nobody.list_tools()
