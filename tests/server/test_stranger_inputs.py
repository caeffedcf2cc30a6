"""What a stranger can send to a node and what it gets back: bodies over the cap on
every route, a client hanging up mid-body, a probe for sessions through ``cancel``,
a rebound ``Host`` on the ops port, a session list that a filter makes long. Each
against a real hypercorn server; where a request is refused, the store is unchanged."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from eventually import eventually
from server_support import dump, serve_app, serving
from starlette.applications import Starlette
from suite_paths import CHILDREN

import turnkit
from turnkit.server import Principal, ServerLimits, SessionAccess, ops_app
from turnkit.server._body_limit import DRAIN_BYTES
from turnkit.slack import slack_channel
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel

pytest.importorskip("mcp")
from turnkit.mcp import server as mcp_server

ALICE = {"X-User": "alice"}
BOB = {"X-User": "bob"}
MiB = 1024 * 1024


def echo_agent() -> turnkit.Agent:
    return turnkit.Agent(
        name="shop",
        model=ScriptedModel(respond=lambda t: f"you said {t[-1].text}"),
        instructions=".",
    )


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[turnkit.Runtime]:
    async with turnkit.Runtime([echo_agent()], store=SqliteStore(tmp_path / "t.db")) as rt:
        yield rt


def db_of(runtime: turnkit.Runtime) -> Path:
    store = runtime.store
    assert isinstance(store, SqliteStore)
    return store.path


async def raw_request(url: str, head: str, body: bytes = b"", *, close: bool = False) -> bytes:
    """Send ``head`` (the request line and headers) and ``body`` over a raw socket;
    the answer (its head, and its body by ``Content-Length``, else up to EOF: a
    refusal's connection may stay open while the server drains the rest of a body
    this client never sends), or nothing when ``close`` hangs up right after sending."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    await writer.drain()
    if close:
        writer.close()
        return b""
    try:
        return await asyncio.wait_for(read_answer(reader), 20)
    finally:
        writer.close()


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return head + await reader.readexactly(int(value))
    return head + await reader.read()


async def over_cap(url: str, path: str, cap: int, *, declared: bool) -> tuple[int, bytes]:
    """POST one byte more than ``cap`` to ``path``: announced in ``Content-Length``
    with no body sent (the server must answer without waiting for it), or chunked,
    without the closing chunk (the server must answer once it has read past the
    cap). The status and body of the answer."""
    head = (
        f"POST {path} HTTP/1.1\nHost: 127.0.0.1\nX-User: alice\nConnection: close\n"
        "Content-Type: application/json\n"
    )
    if declared:
        answer = await raw_request(url, head + f"Content-Length: {cap + 1}\n")
    else:
        piece = 16 * 1024
        body = b"".join(
            f"{min(piece, cap + 1 - at):x}\r\n".encode() + b"x" * min(piece, cap + 1 - at) + b"\r\n"
            for at in range(0, cap + 1, piece)
        )
        answer = await raw_request(url, head + "Transfer-Encoding: chunked\n", body)
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def chunked(total: int, piece: int = 64 * 1024) -> Any:
    """A body of ``total`` bytes sent without a Content-Length (chunked)."""

    async def pieces() -> AsyncIterator[bytes]:
        sent = 0
        while sent < total:
            yield b"x" * min(piece, total - sent)
            sent += piece

    return pieces()


# -- item 2: a body over the cap is refused before it is read, on every route --------


async def test_item2_every_route_refuses_a_body_over_the_cap_with_413(
    runtime: turnkit.Runtime,
) -> None:
    agent = runtime.agents["shop"]
    limits = ServerLimits(max_body_bytes=16 * 1024)
    mcp = mcp_server(runtime, agent)
    async with serving(runtime, limits=limits, mcp=mcp) as served:
        await served.client.post(
            served.path("shop", "s1", "chat"), json={"text": "hello"}, headers=ALICE
        )
        before = dump(db_of(runtime))
        routes = [
            served.path("shop", "s1", "turns"),
            served.path("shop", "s1", "chat"),
            served.path("shop", "s1", "resume"),
            served.path("shop", "s1", "reset"),
            served.path("shop", "s1", "cancel"),
            "/mcp",
        ]
        for path in routes:
            for declared in (True, False):
                status, body = await over_cap(served.url, path, 16 * 1024, declared=declared)
                assert status == 413, (path, declared, body)
                if path != "/mcp":  # the MCP SDK's app words its own refusal
                    assert b'"body_too_large"' in body, (path, declared, body)
        # Refused before authentication could even be asked: no principal needed.
        anonymous = await served.client.post(
            served.path("shop", "s1", "turns"),
            content=b"x" * (17 * 1024),
            headers={"Content-Type": "application/json"},
        )
        assert anonymous.status_code == 413
        assert dump(db_of(runtime)) == before


async def test_item2_the_slack_routes_and_the_ops_port_cap_their_bodies(
    runtime: turnkit.Runtime,
) -> None:
    from turnkit.slack._channel import MAX_BODY_BYTES

    agent = runtime.agents["shop"]
    slack = slack_channel(
        signing_secret="s", bot_token="xoxb-t", base_url="http://127.0.0.1:9/api/"
    )
    app = Starlette()
    app.mount("/slack", slack.app(turnkit.mount_agent(agent, runtime, channels=[slack])))
    app.mount("/ops", ops_app(runtime))
    before = dump(db_of(runtime))
    async with serve_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        for path in ("/slack/events", "/slack/interactivity"):
            for declared in (True, False):
                status, body = await over_cap(url, path, MAX_BODY_BYTES, declared=declared)
                assert status == 413, (path, declared, body)
        ops = await client.request("GET", "/ops/healthz", content=b"x" * 1025)
        assert ops.status_code == 413
    assert dump(db_of(runtime)) == before


@pytest.mark.slow
async def test_item2_unsigned_64_mib_slack_posts_do_not_grow_the_server(tmp_path: Path) -> None:
    """The issue's case: one unsigned 64 MiB POST raised the server by 110 MiB and
    four at once by 425 MiB. Measured as the server process's peak RSS."""
    child = subprocess.Popen(
        [sys.executable, str(CHILDREN / "slack_server_child.py"), str(tmp_path / "t.db")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60))
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            # Warm up: the first request imports and allocates what every later one uses.
            assert (await client.post("/slack/events", content=b"{}")).status_code == 401
        before = peak_rss(child.pid)

        async def send(declared: bool) -> None:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                body = b"x" * (64 * MiB) if declared else chunked(64 * MiB, MiB)
                try:
                    reply = await client.post("/slack/events", content=body)
                except httpx.TransportError:
                    return  # cut off once refused: what matters is the server's memory
                assert reply.status_code == 413

        await asyncio.gather(send(True), *(send(False) for _ in range(4)))
        grown = peak_rss(child.pid) - before
        assert grown < 16 * MiB, f"the server grew by {grown / MiB:.1f} MiB"
    finally:
        child.kill()
        child.wait(10)


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


# -- a refused body's answer reaches a client that sends all of its body first --------


@asynccontextmanager
async def served_by(server: str, tmp_path: Path, cap: int) -> AsyncIterator[str]:
    """The HTTP app with bodies capped at ``cap`` bytes, served by hypercorn (in this
    process, as ``turnkit dev`` serves) or uvicorn (in a child process); its URL."""
    if server.startswith("hypercorn"):
        store = SqliteStore(tmp_path / "t.db")
        limits = ServerLimits(max_body_bytes=cap)
        async with (
            turnkit.Runtime([echo_agent()], store=store) as rt,
            serving(rt, limits=limits) as served,
        ):
            yield served.url
        return
    child = subprocess.Popen(
        [sys.executable, str(CHILDREN / "uvicorn_app_child.py"), str(tmp_path / "t.db"), str(cap)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60))
        yield f"http://127.0.0.1:{port}"
    finally:
        child.kill()
        child.wait(10)


def counted(total: int, piece: int) -> tuple[AsyncIterator[bytes], list[int]]:
    """A chunked body of ``total`` bytes (no Content-Length), and the count of bytes
    handed to the client so far."""
    sent = [0]

    async def pieces() -> AsyncIterator[bytes]:
        while sent[0] < total:
            yield b"x" * piece
            sent[0] += piece

    return pieces(), sent


@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "content-length"])
@pytest.mark.parametrize("server", ["hypercorn", "hypercorn-http2", "uvicorn"])
async def test_a_body_over_the_cap_gets_its_413_on_a_real_server(
    server: str, declared: bool, tmp_path: Path
) -> None:
    """httpx sends all of a body before it reads the answer. Refused at the cap, the
    rest of the body must still be read (and dropped) before the answer ends: hypercorn
    closes the connection when a response ends with the request still arriving, and
    the bytes that then arrive make the kernel reset the connection, so the client
    reads the reset instead of the 413 (over HTTP/2, hypercorn fails on data for a
    stream it has closed and drops the connection)."""
    cap = 16 * 1024
    http2 = server.endswith("http2")  # (prior knowledge: no TLS here)
    async with (
        served_by(server, tmp_path, cap) as url,
        httpx.AsyncClient(base_url=url, timeout=30, http1=not http2, http2=http2) as client,
    ):
        body = b"x" * (256 * 1024) if declared else counted(256 * 1024, 16 * 1024)[0]
        reply = await client.post(
            "/agents/shop/sessions/s1/turns",
            content=body,
            headers={**ALICE, "Content-Type": "application/json"},
        )
        assert ("content-length" in reply.request.headers) == declared
        assert reply.status_code == 413, reply.text
        assert reply.json()["code"] == "body_too_large"
        assert f"the limit of {cap} bytes" in reply.json()["error"]
        assert reply.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
        # An HTTP/1 connection with a refused body on it carries no other request.
        assert reply.headers.get("connection") == (None if http2 else "close")
        listed = await client.get("/agents/shop/sessions", headers=ALICE)
        assert listed.status_code == 200 and listed.json()["sessions"] == []


@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "content-length"])
@pytest.mark.parametrize("server", ["hypercorn", "hypercorn-http2", "uvicorn"])
async def test_a_request_refused_before_its_body_is_read_leaves_the_connection_usable(
    server: str, declared: bool, tmp_path: Path
) -> None:
    """A request the host guard refuses from its headers alone (another site's
    ``Origin``) has a body under the cap still arriving: the refusal must read it
    (and drop it) before it ends, or hypercorn drops the connection under the answer
    and a client that reuses the connection for its next request finds it gone (the
    dev server's rebinding test saw "Server disconnected" now and then)."""
    http2 = server.endswith("http2")
    async with (
        served_by(server, tmp_path, MiB) as url,
        httpx.AsyncClient(base_url=url, timeout=30, http1=not http2, http2=http2) as client,
    ):
        for _ in range(3):
            body = b"x" * (256 * 1024) if declared else counted(256 * 1024, 16 * 1024)[0]
            reply = await client.post(
                "/agents/shop/sessions/s1/turns",
                content=body,
                headers={**ALICE, "Origin": "http://attacker.example"},
            )
            assert reply.status_code == 403, reply.text
            assert reply.json()["code"] == "cross_origin"
            listed = await client.get("/agents/shop/sessions", headers=ALICE)
            assert listed.status_code == 200 and listed.json()["sessions"] == []


@pytest.mark.parametrize("server", ["hypercorn", "uvicorn"])
async def test_a_refused_body_is_read_only_a_bounded_way_past_the_cap(
    server: str, tmp_path: Path
) -> None:
    """What the server drops after a refusal is bounded (``DRAIN_BYTES``): a client
    sending on and on is cut off, not read to its end."""
    cap = 16 * 1024
    body, sent = counted(64 * MiB, 64 * 1024)
    async with (
        served_by(server, tmp_path, cap) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        with pytest.raises(httpx.TransportError):
            await client.post("/agents/shop/sessions/s1/turns", content=body, headers=ALICE)
    # What the server read, plus what the sockets' buffers took in before the reset.
    assert sent[0] < DRAIN_BYTES + 16 * MiB, sent[0]


# -- item 7: a client hanging up mid-body is a debug line, not an ERROR traceback -------


async def test_item7_a_client_gone_mid_body_is_logged_as_one_debug_line(
    runtime: turnkit.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="turnkit")
    async with serving(runtime) as served:
        head = (
            f"POST {served.path('shop', 's1', 'turns')} HTTP/1.1\n"
            "Host: 127.0.0.1\nX-User: alice\nConnection: close\nContent-Type: application/json\n"
            "Content-Length: 1000\n"
        )
        await raw_request(served.url, head, b'{"text": "hel', close=True)
        await eventually(
            lambda: any("went away" in r.getMessage() for r in caplog.records),
            what="the disconnect logged",
        )
        # The server still answers, and nothing was stored for the half-sent turn.
        ok = await served.client.get("/agents", headers=ALICE)
        assert ok.status_code == 200
    gone = [r for r in caplog.records if "went away" in r.getMessage()]
    assert [r.levelno for r in gone] == [logging.DEBUG]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert await runtime.sessions() == []


# -- item 8: cancel tells a missing session from another's no more than any route ----


async def test_item8_cancel_answers_a_missing_session_as_it_answers_anothers(
    runtime: turnkit.Runtime,
) -> None:
    async with serving(runtime) as served:
        await served.client.post(
            served.path("shop", "mine", "chat"), json={"text": "hi"}, headers=ALICE
        )
        before = dump(db_of(runtime))
        theirs = await served.client.post(served.path("shop", "mine", "cancel"), headers=BOB)
        ghost = await served.client.post(
            served.path("shop", "mine", "cancel").replace("/mine/", "/ghost/"), headers=BOB
        )
        assert theirs.status_code == ghost.status_code == 404
        assert theirs.json()["code"] == ghost.json()["code"] == "unknown_session"
        assert theirs.content.replace(b"mine", b"ghost") == ghost.content
        assert dump(db_of(runtime)) == before
        # The owner cancels (nothing is unfinished) and is answered as before.
        own = await served.client.post(served.path("shop", "mine", "cancel"), headers=ALICE)
        assert own.status_code == 200 and own.json() == {"cancelled": []}


# -- item 10: the ops port answers only addresses, loopback names and its own names ----


async def test_item10_the_ops_port_refuses_a_rebound_host(runtime: turnkit.Runtime) -> None:
    app = ops_app(runtime, allowed_hosts=["worker-0.workers.svc"])
    async with serve_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        port = url.rsplit(":", 1)[1]
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io"):
            refused = await client.get("/metrics", headers={"Host": host})
            assert refused.status_code == 421, host
            assert "turnkit_" not in refused.text
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            "10.1.2.3:9100",  # Prometheus scraping a pod by its address
            "[fd00::1]:9100",
            "worker-0.workers.svc:9100",
        ):
            assert (await client.get("/healthz", headers={"Host": host})).status_code == 200, host


# -- item 12: a filtered session list reads in bounded batches, with a cursor ----------


async def test_item12_a_filtered_list_reads_few_batches_and_hands_back_a_cursor(
    runtime: turnkit.Runtime,
) -> None:
    from turnkit.server._sessions_page import MAX_READS, SCAN_BATCH

    total = 2 * SCAN_BATCH * MAX_READS + 50
    for n in range(total):
        await runtime.session("shop", f"s{n:04d}").turn("hi")
    reads = 0
    real = runtime.store.session_page

    async def counted(**kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await real(**kwargs)

    runtime.store.session_page = counted  # type: ignore[method-assign]

    def only_the_oldest(principal: Principal, access: SessionAccess) -> bool:
        return access.session_id == "s0000"

    async with serving(runtime, authorize=only_the_oldest) as served:
        found: list[str] = []
        cursor: str | None = None
        requests = 0
        while True:
            params = {"limit": "1", **({"cursor": cursor} if cursor else {})}
            reads = 0
            page = await served.client.get("/agents/shop/sessions", params=params, headers=ALICE)
            assert page.status_code == 200, page.text
            assert reads <= MAX_READS
            requests += 1
            found += [row["session_id"] for row in page.json()["sessions"]]
            cursor = page.json()["next"]
            if cursor is None:
                break
        # 2,050 rows, 200 a read, five reads a request: three requests, not 1,026.
        assert found == ["s0000"]
        assert requests == 3


async def test_item12_an_unfiltered_list_still_pages_by_one_read(runtime: turnkit.Runtime) -> None:
    async with serving(runtime) as served:
        for n in range(5):
            await served.client.post(
                served.path("shop", f"a{n}", "chat"), json={"text": "hi"}, headers=ALICE
            )
        seen: list[str] = []
        cursor: str | None = None
        while True:
            params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
            page = await served.client.get("/agents/shop/sessions", params=params, headers=ALICE)
            body = page.json()
            assert len(body["sessions"]) <= 2
            seen += [row["session_id"] for row in body["sessions"]]
            cursor = body["next"]
            if cursor is None:
                break
        assert seen == [f"a{n}" for n in reversed(range(5))]


# -- helpers ---------------------------------------------------------------------------
