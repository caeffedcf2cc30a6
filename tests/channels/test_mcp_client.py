"""``turnkit.mcp.mcp_tools``: real MCP servers built with the official SDK, reached over
stdio (a subprocess) and Streamable HTTP (hypercorn on loopback), driven by turns."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from fakes.mcp_server import KEY, build
from mcp.server import MCPServer
from server_support import serve_app
from suite_paths import FAKES

import turnkit
from turnkit import ToolMessage
from turnkit.mcp import IDEMPOTENCY_KEY, McpTools, http, mcp_tools, stdio
from turnkit.stores import MemoryStore, SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

FIXTURE = FAKES / "mcp_server.py"


def test_the_fixture_reads_the_key_where_turnkit_puts_it() -> None:
    assert KEY == IDEMPOTENCY_KEY


def seen(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def stdio_tools(log: Path, **options: Any) -> McpTools:
    server = stdio(sys.executable, str(FIXTURE), env={"MCP_FIXTURE_LOG": str(log)})
    return mcp_tools(server, name="fixture", **options)


@asynccontextmanager
async def serving_mcp(server: MCPServer) -> AsyncIterator[str]:
    """``server`` over Streamable HTTP on a free loopback port; yields its URL."""
    async with serve_app(server.streamable_http_app(), lifespan=True) as url:
        yield f"{url}/mcp"


def replies(*steps: ScriptedReply | str) -> Callable[[Any], ScriptedReply | str]:
    """A ``respond`` that plays ``steps`` by the number of model steps taken so far in
    the transcript's last turn, so a replay asks for the same step again."""

    def respond(transcript: Any) -> ScriptedReply | str:
        turn = transcript[-1].turn_id
        done = sum(
            1 for m in transcript if isinstance(m, turnkit.AssistantMessage) and m.turn_id == turn
        )
        return steps[done]

    return respond


def results(messages: list[turnkit.Message]) -> dict[str, ToolMessage]:
    return {m.call_id: m for m in messages if isinstance(m, ToolMessage)}


async def test_a_stdio_servers_tools_are_listed_and_called(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    model = ScriptedModel(
        respond=replies(ScriptedReply(tool_calls=[tool_call("add", {"a": 2, "b": 3})]), "Five.")
    )
    agent = turnkit.Agent(name="a", model=model, tools=[stdio_tools(log)])
    async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
        assert await rt.session("a", "s1").turn("add") == "Five."
        messages = await rt.session("a", "s1").messages()
    offered = {spec.name: spec for spec in model.calls[0].tools}
    assert set(offered) == {"add", "refuse", "broken", "hang"}
    assert offered["add"].description == "Add two numbers."
    assert offered["add"].input_schema["required"] == ["a", "b"]
    assert results(messages)["call_1"].result == {"result": 5}
    [call] = seen(log)
    assert call["tool"] == "add" and call["key"].startswith("tk-")


async def test_errors_are_results_the_model_reads(tmp_path: Path) -> None:
    """An ``isError`` result and a JSON-RPC error both reach the model as errors."""
    calls = [
        tool_call("add", {"a": 1, "b": 1}),
        tool_call("refuse", {"reason": "not today"}),
        tool_call("broken"),
    ]
    async with serving_mcp(build(tmp_path / "calls.jsonl")) as url:
        model = ScriptedModel(respond=replies(ScriptedReply(tool_calls=calls), "Noted."))
        agent = turnkit.Agent(name="a", model=model, tools=[mcp_tools(http(url))])
        async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
            assert await rt.session("a", "s1").turn("go") == "Noted."
            by_call = results(await rt.session("a", "s1").messages())
    assert by_call["call_1"].result == {"result": 2} and not by_call["call_1"].is_error
    assert by_call["call_2"].is_error and "refused: not today" in by_call["call_2"].result["error"]
    assert by_call["call_3"].is_error
    assert "error -32603: the fixture broke on purpose" in by_call["call_3"].result["error"]


async def test_a_server_that_cannot_list_fails_the_turn_cleanly() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    nobody = f"http://127.0.0.1:{closed.getsockname()[1]}/mcp"
    closed.close()
    model = ScriptedModel(["never asked"])
    agent = turnkit.Agent(name="a", model=model, tools=[mcp_tools(nobody, name="gone")])
    async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
        session = rt.session("a", "s1")
        result = await session.result(session.start("hi"))
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("tool source 'gone' could not list its tools: ")
    assert "could not be reached" in result.error or "Unreachable" in result.error
    assert model.calls == []


async def test_a_replay_offers_the_tools_listed_when_the_turn_opened(tmp_path: Path) -> None:
    """The listing is stored with the turn: a redelivery in a new runtime (as another
    process would) offers what the server listed then, not what it lists now; and a
    server gone by then is an error result the model reads."""
    db = tmp_path / "turnkit.db"
    fixture = build(tmp_path / "calls.jsonl")
    fail_once = {"t1", "t2"}
    play = replies(ScriptedReply(tool_calls=[tool_call("add", {"a": 1, "b": 2})]), "Ok.")

    def respond(transcript: Any) -> ScriptedReply | str:
        turn = transcript[-1].turn_id
        if turn in fail_once:
            fail_once.discard(turn)
            raise turnkit.ModelError("the provider is down")
        return play(transcript)

    transcript: list[turnkit.Message] = []

    async def deliver(url: str, turn_id: str) -> tuple[turnkit.TurnResult, ScriptedModel]:
        model = ScriptedModel(respond=respond)
        agent = turnkit.Agent(name="a", model=model, tools=[mcp_tools(url, name="fixture")])
        async with turnkit.Runtime([agent], store=SqliteStore(db)) as rt:
            session = rt.session("a", "s1")
            result = await session.result(session.start("go", turn_id=turn_id))
            transcript[:] = await session.messages()
            return result, model

    v1 = {"add", "refuse", "broken", "hang"}
    async with serving_mcp(fixture) as url:
        failed, first = await deliver(url, "t1")
        assert failed.status == "failed"
        fixture.add_tool(lambda a, b: a * b, name="multiply", description="Multiply.")
        replayed, again = await deliver(url, "t1")
        assert replayed.text == "Ok."
        failed, second = await deliver(url, "t2")
        assert failed.status == "failed"
    assert {s.name for s in first.calls[0].tools} == v1
    assert {s.name for s in again.calls[0].tools} == v1  # t1 replayed: as listed then
    assert {s.name for s in second.calls[0].tools} == v1 | {"multiply"}  # t2 is new
    # The server is gone: t2's replay offers its stored tools, and the call fails.
    replayed, late = await deliver(url, "t2")
    assert replayed.text == "Ok."
    assert {s.name for s in late.calls[0].tools} == v1 | {"multiply"}
    gone = [m for m in transcript if isinstance(m, ToolMessage) and m.turn_id == "t2"]
    assert len(gone) == 1 and gone[0].is_error
    assert "MCP server 'fixture' could not be reached" in gone[0].result["error"]


async def test_deny_tools_takes_an_mcp_tool_away_from_a_source(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    async with serving_mcp(build(log)) as url:
        model = ScriptedModel(
            respond=replies(
                ScriptedReply(tool_calls=[tool_call("fx_add", {"a": 1, "b": 1})]), "No."
            )
        )
        agent = turnkit.Agent(
            name="a",
            model=model,
            tools=[mcp_tools(url, prefix="fx_")],
            # Not a tool the agent declares: with a source it may be one of its tools.
            surfaces={"slack": turnkit.SurfacePolicy(deny_tools=["fx_add"])},
        )
        event = turnkit.InboundEvent(source="slack", text="add", user=turnkit.User(id="u1"))
        async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
            assert await rt.session("a", "s1").turn("add", event=event) == "No."
            [answer] = results(await rt.session("a", "s1").messages()).values()
    assert {s.name for s in model.calls[0].tools} == {"fx_refuse", "fx_broken", "fx_hang"}
    assert answer.is_error and answer.result == {"error": "unknown tool: fx_add"}
    assert seen(log) == []


def test_mcp_tools_is_checked_when_the_agent_is_built() -> None:
    with pytest.raises(turnkit.ConfigurationError, match=r"turnkit\.mcp\.stdio"):
        mcp_tools("python server.py")
    with pytest.raises(turnkit.ConfigurationError, match="prefix"):
        mcp_tools("http://127.0.0.1:1/mcp", prefix="a.b")
    with pytest.raises(turnkit.ConfigurationError, match="timeout"):
        mcp_tools("http://127.0.0.1:1/mcp", timeout=0)
    one = mcp_tools("http://user:secret@127.0.0.1:1/mcp?token=x")
    assert one.key == "mcp:http://127.0.0.1:1/mcp"  # no credentials in what is stored
    with pytest.raises(turnkit.ConfigurationError, match="share the key"):
        turnkit.Agent(name="a", model=ScriptedModel(), tools=[one, one])


@pytest.mark.slow
async def test_a_server_killed_mid_call_fails_the_step_and_a_redelivery_calls_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "calls.jsonl"
    model = ScriptedModel(
        respond=replies(ScriptedReply(tool_calls=[tool_call("hang", {"text": "x"})]), "Finished.")
    )
    agent = turnkit.Agent(name="a", model=model, tools=[stdio_tools(log)])
    async with turnkit.Runtime([agent], store=SqliteStore(tmp_path / "turnkit.db")) as rt:
        session = rt.session("a", "s1")
        running = asyncio.create_task(session.result(session.start("go", turn_id="t1")))
        await eventually(lambda: seen(log), what="the call seen by the server", timeout=60)
        [first] = seen(log)
        os.kill(first["pid"], signal.SIGKILL)
        async with asyncio.timeout(60):
            failed = await running
        assert failed.status == "failed" and failed.error is not None
        assert "gave no answer to the call of 'hang'" in failed.error
        assert results(await session.messages()) == {}  # the step was not recorded
        done = await session.result(session.start("", turn_id="t1"))
        assert done.text == "Finished."
        [answer] = results(await session.messages()).values()
    assert answer.result == {"result": "done: x"} and not answer.is_error
    first, second = seen(log)
    assert second["key"] == first["key"] and second["pid"] != first["pid"]


async def test_an_agent_folder_takes_mcp_tools_in_a_tools_module_and_in_agent_py(
    tmp_path: Path,
) -> None:
    """Issue 37 item 1: ``mcp_tools(...)`` in ``tools/*.py`` or in ``agent.py``'s
    ``tools`` setting reaches ``load_agent`` (and so ``run``, ``dev``, ``worker``)."""
    folder = tmp_path / "weather"
    (folder / "tools").mkdir(parents=True)
    log = tmp_path / "calls.jsonl"
    server = f"stdio({sys.executable!r}, {str(FIXTURE)!r}, env={{'MCP_FIXTURE_LOG': {str(log)!r}}})"
    (folder / "tools" / "maths.py").write_text(
        f"from turnkit.mcp import mcp_tools, stdio\n\nmaths = mcp_tools({server})\n"
    )
    (folder / "agent.py").write_text(
        "from turnkit.mcp import mcp_tools, stdio\n\n"
        f"agent = {{'tools': [mcp_tools({server}, prefix='again_', name='again')]}}\n"
    )
    model = ScriptedModel(
        respond=replies(
            ScriptedReply(
                tool_calls=[
                    tool_call("add", {"a": 2, "b": 3}),
                    tool_call("again_add", {"a": 1, "b": 1}),
                ]
            ),
            "Done.",
        )
    )
    agent = turnkit.load_agent(folder, model=model)
    assert len(agent.tool_sources) == 2
    async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
        assert await rt.session("weather", "s1").turn("add") == "Done."
        messages = await rt.session("weather", "s1").messages()
    assert [m.result for m in results(messages).values()] == [{"result": 5}, {"result": 2}]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "agent.py").write_text("agent = {'tools': ['not a tool']}\n")
    with pytest.raises(turnkit.ConfigurationError, match=r"neither a Tool .* nor a tool source"):
        turnkit.load_agent(bad, model=model)
