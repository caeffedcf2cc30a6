"""``mcp_tools`` keeps one connection per server while a ``Runtime`` runs: opened at
the first listing or call, shared by concurrent calls, opened again when the server
went away, closed with the runtime. A server killed mid-call (stdio in
test_mcp_client, Streamable HTTP here, in a process of its own) still fails the step
unrecorded, and a redelivery calls again with the same key."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually, eventually_blocking
from test_mcp_client import FIXTURE, replies, results, seen, stdio_tools

import turnkit
from turnkit.mcp import http, mcp_tools
from turnkit.stores import MemoryStore, SqliteStore
from turnkit.testing import ScriptedReply, tool_call

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def fixture_processes() -> set[int]:
    """The live (not yet exited) fixture servers this process started."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == os.getpid() and state != "Z" and str(FIXTURE).encode() in cmdline:
            found.add(int(entry.name))
    return found


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def adding(count: int) -> Any:
    """A model asking for ``count`` additions at once, then saying ``Done.``"""
    calls = [tool_call("add", {"a": n, "b": 1}) for n in range(count)]
    return replies(ScriptedReply(tool_calls=calls), "Done.")


def noticed_lost(tools: Any) -> bool:
    """Whether the shared connection of ``tools`` on this loop has marked itself lost
    (it reads the end of a dead server's output). No public name says so: this reads
    the connection's own flag, which decides where the next call goes."""
    shared = tools._connections._loops.get(asyncio.get_running_loop())
    return shared is None or shared.current is None or shared.current.lost


async def test_one_stdio_process_serves_a_runtimes_calls_and_ends_with_it(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    model = turnkit.testing.ScriptedModel(respond=adding(5))
    agent = turnkit.Agent(name="a", model=model, tools=[stdio_tools(log)], max_parallel_tools=5)
    async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
        assert fixture_processes() == set()  # nothing is started before it is needed
        for n in range(3):
            assert await rt.session("a", f"s{n}").turn("add") == "Done."
            assert len(fixture_processes()) == 1
        # Turns of several sessions at once: their calls share the one connection.
        turns = [rt.session("a", f"p{n}").turn("add") for n in range(3)]
        assert await asyncio.gather(*turns) == ["Done."] * 3
        assert len(fixture_processes()) == 1
        answers = results(await rt.session("a", "p2").messages())
        assert [answers[f"call_{k}"].result for k in range(1, 6)] == [
            {"result": n + 1} for n in range(5)
        ]
    assert fixture_processes() == set()
    calls = seen(log)
    assert len(calls) == 30 and len({c["pid"] for c in calls}) == 1
    assert len({c["key"] for c in calls}) == 30


async def test_a_stdio_server_that_went_away_is_started_again_for_the_next_call(
    tmp_path: Path,
) -> None:
    log = tmp_path / "calls.jsonl"
    tools = stdio_tools(log)
    await tools.open()
    try:
        assert await tools.call("add", {"a": 1, "b": 2}, "k1") == {"result": 3}
        [first] = fixture_processes()
        os.kill(first, signal.SIGKILL)
        await eventually(lambda: gone(first), what="the killed server gone")
        await eventually(lambda: noticed_lost(tools), what="the connection marked lost")
        # The connection was lost before this call: it is sent on a new one.
        assert await tools.call("add", {"a": 2, "b": 2}, "k2") == {"result": 4}
        [second] = fixture_processes()
        assert second != first
        assert [c["pid"] for c in seen(log)] == [first, second]
    finally:
        await tools.close()
    assert fixture_processes() == set()


async def test_a_source_in_two_runtimes_stays_open_until_the_last_closes(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    tools = stdio_tools(log)
    agent = turnkit.Agent(
        name="a", model=turnkit.testing.ScriptedModel(respond=adding(1)), tools=[tools]
    )
    async with turnkit.Runtime([agent], store=MemoryStore()) as outer:
        async with turnkit.Runtime([agent], store=MemoryStore()) as inner:
            assert await inner.session("a", "s1").turn("add") == "Done."
        assert len(fixture_processes()) == 1
        assert await outer.session("a", "s1").turn("add") == "Done."
        assert len(fixture_processes()) == 1
    assert fixture_processes() == set()
    assert len({c["pid"] for c in seen(log)}) == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_http_fixture(log: Path, port: int) -> subprocess.Popen[bytes]:
    """The fixture server over Streamable HTTP (the initialize handshake and a
    session) in a process of its own, on ``port``, once it accepts connections
    (blocking: it may run inside a model's reply)."""
    env = {
        **os.environ,
        "MCP_FIXTURE_LOG": str(log),
        "MCP_FIXTURE_HTTP_PORT": str(port),
        "MCP_FIXTURE_LEGACY": "1",  # with an HTTP session, which a restart forgets
    }
    process = subprocess.Popen([sys.executable, str(FIXTURE)], env=env)

    def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the fixture server exited with {process.returncode}")
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True

    try:
        eventually_blocking(listening, what="the fixture server listening", ignoring=(OSError,))
    except BaseException:
        process.kill()
        raise
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()


@pytest.mark.slow
async def test_an_http_server_killed_mid_call_fails_the_step_and_a_redelivery_calls_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "calls.jsonl"
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"

    servers: list[subprocess.Popen[bytes]] = []

    def respond(transcript: Any) -> Any:
        turn = transcript[-1].turn_id
        first_step = not isinstance(transcript[-1], turnkit.ToolMessage)
        if turn == "t2" and first_step:
            # Restarted after the listing: the new server does not know the session.
            stop(servers[-1])
            servers.append(start_http_fixture(log, port))
        if turn == "t3" and first_step:
            stop(servers[-1])  # after the listing, before the call
        return {
            "t1": replies(ScriptedReply(tool_calls=[tool_call("hang", {"text": "x"})]), "Hung."),
            "t2": adding(1),
            "t3": replies(ScriptedReply(tool_calls=[tool_call("add", {"a": 5, "b": 5})]), "Gone."),
        }[turn](transcript)

    model = turnkit.testing.ScriptedModel(respond=respond)
    agent = turnkit.Agent(name="a", model=model, tools=[mcp_tools(http(url), name="fixture")])
    try:
        async with turnkit.Runtime([agent], store=SqliteStore(tmp_path / "turnkit.db")) as rt:
            session = rt.session("a", "s1")
            servers.append(start_http_fixture(log, port))
            running = asyncio.create_task(session.result(session.start("go", turn_id="t1")))
            await eventually(lambda: seen(log), what="the call seen by the server", timeout=60)
            stop(servers[-1])
            async with asyncio.timeout(60):
                failed = await running
            assert failed.status == "failed" and failed.error is not None
            assert "gave no answer to the call of 'hang'" in failed.error
            assert results(await session.messages()) == {}  # the step was not recorded

            servers.append(start_http_fixture(log, port))
            done = await session.result(session.start("", turn_id="t1"))
            assert done.text == "Hung."
            [answer] = results(await session.messages()).values()
            assert answer.result == {"result": "done: x"} and not answer.is_error
            first, second = seen(log)
            assert second["key"] == first["key"] and second["pid"] != first["pid"]

            # The server refuses the call for a session it no longer knows: it is
            # sent again on a new connection.
            added = await session.result(session.start("add", turn_id="t2"))
            assert added.text == "Done."
            assert [c["tool"] for c in seen(log)] == ["hang", "hang", "add"]

            # A server gone before the call was sent: nothing ran, and the model reads so.
            stopped = await session.result(session.start("add", turn_id="t3"))
            assert stopped.text == "Gone."
            [*_, error] = results(await session.messages()).values()
            assert error.is_error and "could not be reached" in error.result["error"]
    finally:
        for server in servers:
            stop(server)
    assert len(seen(log)) == 3
