"""Property-based fuzzing of the HTTP surface: whatever body, header or path a client
sends, the answer is a 2xx or a JSON 4xx naming the problem, never a 500, and a
refused request leaves the store exactly as it was."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_support import Served, serving, snapshot

import turnkit
from turnkit import ToolContext, tool
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def fuzz_agent() -> turnkit.Agent:
    @tool
    async def approve(what: str, ctx: ToolContext) -> str:
        """Asks a person."""
        ok = await ctx.request_input("ok", f"Allow {what}?", schema={"type": "boolean"})
        return "allowed" if ok else "refused"

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage) and last.text.startswith("ask"):
            return ScriptedReply(tool_calls=[tool_call("approve", {"what": "it"})])
        return ScriptedReply(text="fine")

    return turnkit.Agent(
        name="fz", model=ScriptedModel(respond=respond), instructions=".", tools=[approve]
    )


class ThreadServer:
    """A runtime and its server on a loop of their own, for synchronous hypothesis tests."""

    def __init__(self, db: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.served: Served | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(db),))
        self._thread.start()
        self._ready.wait(30)
        assert self.served is not None, "the server did not start"

    async def _main(self, db: Path) -> None:
        self._stop = asyncio.Event()
        runtime = turnkit.Runtime([fuzz_agent()], store=SqliteStore(db))
        async with runtime, serving(runtime) as served:
            self.served = served
            self._ready.set()
            await self._stop.wait()

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self.loop.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    running = ThreadServer(tmp_path_factory.mktemp("fuzz") / "fuzz.db")
    assert running.served is not None
    with httpx.Client(base_url=running.served.url, timeout=30) as client:
        # One parked session, so that resumes have something to aim at.
        parked = client.post(
            "/agents/fz/sessions/parked/chat", json={"text": "ask"}, headers={"X-User": "u"}
        )
        assert parked.json()["status"] == "suspended"
    yield running
    running.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(["text", "replace", "turn_id", "input_id", "value", "x", ""])
#: Arrays and objects nested ``depth`` levels inside one another, as raw JSON text.
nestings = st.lists(st.sampled_from(["[", '{"k":']), min_size=1, max_size=3000).map(
    lambda opens: "".join(opens) + "1" + "".join("]" if o == "[" else "}" for o in reversed(opens))
)
bodies = st.one_of(
    st.dictionaries(field_names, json_values, max_size=4).map(lambda d: ("json", d)),
    json_values.map(lambda v: ("json", v)),
    st.binary(max_size=300).map(lambda b: ("raw", b)),
    nestings.map(lambda n: ("raw", ('{"text": "x", "value": ' + n + "}").encode())),
)
verbs = st.sampled_from(["turns", "chat", "resume", "reset", "pending", "transcript", "events"])
sessions = st.one_of(st.just("parked"), st.just("s1"), st.text(min_size=1, max_size=30))
agents = st.sampled_from(["fz", "fz", "nobody"])
content_types = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "text/plain", None]
)


@pytest.mark.slow
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(agent=agents, session=sessions, verb=verbs, body=bodies, content_type=content_types)
def test_no_request_gets_a_500_or_changes_the_store_when_refused(
    server: ThreadServer,
    agent: str,
    session: str,
    verb: str,
    body: tuple[str, Any],
    content_type: str | None,
) -> None:
    assert server.served is not None
    runtime = server.served.runtime
    before = server.call(snapshot(runtime))
    kind, payload = body
    headers = {"X-User": "u"}
    if content_type:
        headers["Content-Type"] = content_type
    content = json.dumps(payload).encode() if kind == "json" else payload
    method = "GET" if verb in {"pending", "transcript", "events"} else "POST"
    url = f"/agents/{quote(agent, safe='')}/sessions/{quote(session, safe='')}/{verb}"
    params = {"after": "999999", "turn_id": "none"} if verb == "events" else None
    with httpx.Client(base_url=server.served.url, timeout=30) as client:
        reply = client.request(method, url, content=content, headers=headers, params=params)
    assert reply.status_code < 500, (url, content, reply.text)
    if reply.status_code >= 400:
        error = reply.json()
        assert isinstance(error["error"], str) and error["error"], reply.text
        assert server.call(snapshot(runtime)) == before, (url, content, reply.text)


@pytest.mark.slow
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(nesting=nestings, verb=st.sampled_from(["turns", "chat", "resume", "reset"]))
def test_a_body_deeper_than_the_limit_is_refused_as_too_deep(
    server: ThreadServer, nesting: str, verb: str
) -> None:
    """Depth is measured before parsing: past the limit (64, counting the body's own
    object) the answer is 400 ``too_deep`` whatever the route, never a 500."""
    assert server.served is not None
    depth = 1 + nesting.count("[") + nesting.count("{")
    field = "text" if verb in ("turns", "chat") else "value"
    content = f'{{"{field}": {nesting}}}'.encode()
    with httpx.Client(base_url=server.served.url, timeout=30) as client:
        reply = client.post(
            f"/agents/fz/sessions/parked/{verb}",
            content=content,
            headers={"X-User": "u", "Content-Type": "application/json"},
        )
    assert reply.status_code < 500, reply.text
    if depth > 64:
        assert reply.status_code == 400 and reply.json()["code"] == "too_deep", reply.text
    else:
        assert reply.status_code != 400 or reply.json()["code"] != "too_deep", reply.text
