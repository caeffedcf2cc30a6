"""Child process for the A2A crash tests (not collected by pytest).

Usage::

    python a2a_child.py STORE DIR serve
    python a2a_child.py STORE DIR call REMOTE_URL

``STORE`` is a SQLite file path or ``postgresql://…#schema``.

``serve``: agent ``helper`` served over A2A (``create_app(..., frontends=[a2a_server()],
own_runtime=True)``, so it recovers what a killed node left running) on a free
loopback port; prints ``{"url": …}`` once listening, and writes the method of every
JSON-RPC call it is sent to ``DIR/calls``. Its ``work`` tool appends a
line to ``DIR/ran``, creates ``DIR/holding-<pid>`` and waits for ``DIR/release``.

``call``: agent ``lead``, whose only tool is ``a2a_agent(REMOTE_URL)``; recovers what
a killed caller left unfinished, else runs turn ``ask`` on session ``s`` (the model
asks the remote agent), then prints each result as ``<turn> <status> <text>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # for eventually
from eventually import eventually
from shared_session_child import open_store
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import turnkit
from turnkit import ToolMessage, UserMessage, tool
from turnkit.server import Principal, create_app
from turnkit.server._serving import listen, serve_until, until_started
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def by_header(request: Request) -> Principal | None:
    user = request.headers.get("x-user")
    return Principal(id=user) if user else None


def helper(folder: Path) -> turnkit.Agent:
    @tool
    async def work(job: str) -> str:
        """Do the job (once the parent releases it)."""
        with (folder / "ran").open("a") as ran:
            ran.write(f"{os.getpid()} {job}\n")
        (folder / f"holding-{os.getpid()}").touch()
        await eventually((folder / "release").exists, what="the release", timeout=120)
        return f"{job} done"

    def respond(messages: Sequence[turnkit.Message]) -> ScriptedReply:
        last = messages[-1]
        if isinstance(last, UserMessage):
            work_call = tool_call("work", {"job": last.text})
            return ScriptedReply(text="Working.", tool_calls=[work_call])
        assert isinstance(last, ToolMessage)
        return ScriptedReply(text=f"Helper says: {last.result}.")

    return turnkit.Agent(name="helper", model=ScriptedModel(respond=respond), tools=[work])


def lead(remote: str) -> turnkit.Agent:
    from turnkit.a2a import a2a_agent

    def respond(messages: Sequence[turnkit.Message]) -> ScriptedReply:
        last = messages[-1]
        if isinstance(last, UserMessage):
            call = tool_call("helper", {"message": last.text}, id="ask_helper")
            return ScriptedReply(text="Asking the helper.", tool_calls=[call])
        assert isinstance(last, ToolMessage)
        return ScriptedReply(text=f"The helper answered: {json.dumps(last.result)}")

    tool_ = a2a_agent(remote, name="helper", headers={"X-User": "lead-agent"})
    return turnkit.Agent(name="lead", model=ScriptedModel(respond=respond), tools=[tool_])


def logged(app: ASGIApp, path: Path) -> ASGIApp:
    """``app``, writing each JSON-RPC call's method to ``path`` (one a line)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body = bytearray()

        async def tapped() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    with path.open("a") as calls:
                        calls.write(f"{json.loads(body).get('method')}\n")
            return message

        await app(scope, tapped, send)

    return wrapped


async def serve(spec: str, folder: Path) -> None:
    from turnkit.a2a import a2a_server

    runtime = turnkit.Runtime([helper(folder)], store=open_store(spec))
    app = logged(
        create_app(runtime, authenticate=by_header, frontends=[a2a_server()], own_runtime=True),
        folder / "calls",
    )
    listener = listen("127.0.0.1", 0)
    started = asyncio.Event()
    # Served until the test kills this process: nothing sets ``stop``.
    serving = asyncio.ensure_future(
        serve_until(app, [listener], asyncio.Event(), started=started, lifespan=True)
    )
    if await until_started(serving, started):
        print(json.dumps({"url": f"http://127.0.0.1:{listener.getsockname()[1]}"}), flush=True)
    await serving


async def call(spec: str, remote: str) -> None:
    async with turnkit.Runtime([lead(remote)], store=open_store(spec)) as runtime:
        results = await runtime.recover()
        if not results:
            session = runtime.session("lead", "s")
            results = [await session.result(await session.submit("ship it", turn_id="ask"))]
        for result in results:
            print(result.turn_id, result.status, result.text or result.error or "", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    store, where, role = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if role == "serve":
        asyncio.run(serve(store, where))
    elif role == "call":
        asyncio.run(call(store, sys.argv[4]))
    else:
        raise SystemExit(__doc__)
