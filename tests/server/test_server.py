"""The HTTP surface over a real connection: hypercorn on 127.0.0.1, httpx and a standard
SSE client (httpx-sse), on every store."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
from eventually import eventually
from httpx_sse import aconnect_sse
from server_support import Served, decode, gated_agent, serving, snapshot

import turnkit
from turnkit import AnswerCheck, Answerers, ToolContext, tool
from turnkit.server import ServerLimits
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

ALICE = {"X-User": "alice"}
BOOLEAN = {"type": "boolean"}


def calc_agent() -> turnkit.Agent:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = ScriptedModel(
        respond=lambda transcript: (
            ScriptedReply(text="Let me add that.", tool_calls=[tool_call("add", {"a": 2, "b": 3})])
            if isinstance(transcript[-1], turnkit.UserMessage)
            else ScriptedReply(text="2 + 3 = 5, as the tool says.", chunks=4)
        )
    )
    return turnkit.Agent(name="calc", model=model, instructions="Be brief.", tools=[add])


def refund_agent(*, authorize: Any = None, policy: bool = False) -> turnkit.Agent:
    @tool
    async def refund(order_id: str, ctx: ToolContext) -> str:
        """Refund an order once a person approves."""
        answerers = Answerers.policy("refunds") if policy else None
        ok = await ctx.request_input(
            "approve", f"Refund {order_id}?", schema=BOOLEAN, answerers=answerers
        )
        return "refunded" if ok else "declined"

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage):
            return ScriptedReply(tool_calls=[tool_call("refund", {"order_id": "A1"})])
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(text=f"The refund was {last.result}.")

    return turnkit.Agent(
        name="shop",
        model=ScriptedModel(respond=respond),
        instructions="Refund when asked.",
        tools=[refund],
        authorize_answer=authorize,
    )


async def sse(served: Served, method: str, url: str, **kwargs: Any) -> list[Any]:
    kwargs["headers"] = dict(kwargs.get("headers", {}))  # aconnect_sse adds Accept to it
    async with aconnect_sse(served.client, method, url, **kwargs) as source:
        assert source.response.status_code == 200, await source.response.aread()
        assert source.response.headers["content-type"].startswith("text/event-stream")
        return decode([frame async for frame in source.aiter_sse()])


async def requested(session: turnkit.AgentSession) -> bool:
    """Whether a turn of ``session`` has asked for a tool call."""
    return any(e.type == "action.requested" for e in await session.events())


async def test_a_turn_streams_as_server_sent_events(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime) as served:
        frames = await sse(
            served, "POST", served.path("calc", "s1", "turns"), json={"text": "2+3?"}, headers=ALICE
        )
    types = [f.event for f in frames]
    assert types[0] == "turn.started" and types[-1] == "turn.completed"
    assert "action.requested" in types and "action.completed" in types
    assert types.count("message.delta") >= 4  # the final answer came in pieces
    for f in frames:
        assert f.data["type"] == f.event
        # A structural event sets the client's last event id to its sequence number;
        # a delta (no id line) leaves it at the structural event before it.
        assert f.id == str(f.data["seq"]) or (f.event.endswith(".delta") and f.data["seq"] is None)
    logged = await runtime.session("calc", "s1").events()
    assert [f.data for f in frames if f.data["seq"]] == [e.to_dict() for e in logged]
    assert frames[-1].data["text"] == "2 + 3 = 5, as the tool says."


async def test_chat_answers_json_or_streams(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent(), refund_agent())
    async with serving(runtime) as served:
        reply = await served.client.post(
            served.path("calc", "s1", "chat"), json={"text": "2+3?"}, headers=ALICE
        )
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"] == "application/json", reply.text
        body = reply.json()
        assert body["status"] == "completed" and body["text"] == "2 + 3 = 5, as the tool says."
        frames = await sse(
            served,
            "POST",
            served.path("calc", "s1", "chat"),
            json={"text": "again"},
            headers={**ALICE, "Accept": "text/event-stream"},
        )
        assert frames[-1].event == "turn.completed"
        parked = await served.client.post(
            served.path("shop", "s2", "chat"), json={"text": "refund A1"}, headers=ALICE
        )
        assert parked.json()["status"] == "suspended"
        assert parked.json()["request"]["prompt"] == "Refund A1?"


async def test_resume_refusals_change_nothing_and_the_answerer_completes(
    open_runtime: Any,
) -> None:
    runtime = await open_runtime(refund_agent(), calc_agent())
    async with serving(runtime) as served:
        frames = await sse(
            served,
            "POST",
            served.path("shop", "s1", "turns"),
            json={"text": "refund"},
            headers=ALICE,
        )
        assert frames[-1].event == "input.requested"
        turn_id = frames[-1].data["turn_id"]
        pending = (
            await served.client.get(served.path("shop", "s1", "pending"), headers=ALICE)
        ).json()
        assert pending["request"]["id"] == "approve" and pending["request"]["turn_id"] == turn_id
        before = await snapshot(runtime)
        url = served.path("shop", "s1", "resume")
        cases = [
            # Not alice's session, and not named to answer: as if there were no session.
            ({"X-User": "bob"}, {"turn_id": turn_id, "input_id": "approve", "value": True}, 404),
            (ALICE, {"turn_id": "other", "input_id": "approve", "value": True}, 409),
            (ALICE, {"turn_id": turn_id, "input_id": "nope", "value": True}, 409),
            (ALICE, {"turn_id": turn_id, "input_id": "approve", "value": "yes"}, 422),
            ({}, {"turn_id": turn_id, "input_id": "approve", "value": True}, 401),
        ]
        for headers, body, status in cases:
            refused = await served.client.post(url, json=body, headers=headers)
            assert refused.status_code == status, (body, refused.text)
            assert refused.json()["error"], refused.text
            assert await snapshot(runtime) == before
        # A session that is not parked refuses a resume with 409 too.
        await served.client.post(
            served.path("calc", "s9", "chat"), json={"text": "hi"}, headers=ALICE
        )
        idle = await served.client.post(
            served.path("calc", "s9", "resume"),
            json={"turn_id": turn_id, "input_id": "approve", "value": True},
            headers=ALICE,
        )
        assert idle.status_code == 409 and "not waiting" in idle.json()["error"]
        done = await sse(
            served,
            "POST",
            url,
            json={"turn_id": turn_id, "input_id": "approve", "value": True},
            headers=ALICE,
        )
        assert done[-1].event == "turn.completed"
        assert done[-1].data["text"] == "The refund was refunded."
        # The resumed stream opens with who answered, numbered like every logged event.
        answered = done[0]
        assert answered.event == "input.answered" and answered.id is not None
        assert answered.data["by"] == "alice" and answered.data["value"] is True
        assert answered.data["input_id"] == "approve" and answered.data["turn_id"] == turn_id


async def test_authorize_answer_failing_is_a_500_and_the_answer_can_be_sent_again(
    open_runtime: Any,
) -> None:
    seen: list[AnswerCheck] = []
    outage = {"on": True}

    async def authorize(check: AnswerCheck) -> bool:
        seen.append(check)
        if outage["on"]:
            raise ConnectionError("the directory is down")
        return check.principal.claims.get("role") == "refunds"

    runtime = await open_runtime(refund_agent(authorize=authorize, policy=True))

    def roles(request: Any) -> Any:
        from turnkit.server import Principal

        user = request.headers.get("x-user")
        return (
            Principal(id=user, claims={"role": request.headers.get("x-role", "")}) if user else None
        )

    async with serving(runtime, authenticate=roles) as served:
        frames = await sse(
            served,
            "POST",
            served.path("shop", "s1", "turns"),
            json={"text": "refund"},
            headers=ALICE,
        )
        turn_id = frames[-1].data["turn_id"]
        body = {"turn_id": turn_id, "input_id": "approve", "value": True}
        url = served.path("shop", "s1", "resume")
        before = await snapshot(runtime)
        failed = await served.client.post(
            url, json=body, headers={"X-User": "carol", "X-Role": "refunds"}
        )
        assert failed.status_code == 500 and failed.json()["code"] == "resume_failed"
        # The exception's text stays in the server log: it may name hosts or credentials.
        assert "directory" not in failed.text
        assert await snapshot(runtime) == before
        outage["on"] = False
        denied = await served.client.post(
            url, json=body, headers={"X-User": "dave", "X-Role": "sales"}
        )
        # Not the owner, let in only to ask the policy, which said no: nothing to see.
        assert denied.status_code == 404 and denied.json()["code"] == "unknown_session"
        assert await snapshot(runtime) == before
        done = await served.client.post(
            url, json=body, headers={"X-User": "carol", "X-Role": "refunds"}
        )
        # Carol may answer, not read: she learns her answer was taken, nothing more.
        assert done.status_code == 200
        assert done.json() == {"status": "accepted", "turn_id": turn_id, "input_id": "approve"}
        assert (await runtime.session("shop", "s1").result(turn_id)).status == "completed"
    assert seen[-1].by == "carol" and seen[-1].policy == "refunds"


async def test_unauthenticated_requests_get_401_and_touch_nothing(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime) as served:
        for method, url in [
            ("GET", "/agents"),
            ("GET", "/agents/calc/sessions"),
            ("POST", served.path("calc", "s1", "turns")),
            ("POST", served.path("calc", "s1", "chat")),
            ("POST", served.path("calc", "s1", "resume")),
            ("POST", served.path("calc", "s1", "reset")),
            ("GET", served.path("calc", "s1", "pending")),
            ("GET", served.path("calc", "s1", "transcript")),
            ("GET", served.path("calc", "s1", "events")),
        ]:
            reply = await served.client.request(method, url, json={"text": "hi"})
            assert reply.status_code == 401, (method, url)
            assert reply.json() == {"error": "authentication required", "code": "unauthenticated"}
    assert await runtime.sessions() == []


async def test_reset_transcript_pending_and_the_paged_session_list(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime) as served:
        for n in range(5):
            reply = await served.client.post(
                served.path("calc", f"s{n}", "chat"), json={"text": "2+3?"}, headers=ALICE
            )
            assert reply.status_code == 200
        transcript = (
            await served.client.get(served.path("calc", "s0", "transcript"), headers=ALICE)
        ).json()
        assert transcript["status"] == "idle" and transcript["generation"] == 0
        assert "events" not in transcript and transcript["generations"] == []
        with_log = await served.client.get(
            served.path("calc", "s0", "transcript"), params={"events": "true"}, headers=ALICE
        )
        assert [e["seq"] for e in with_log.json()["events"]] == list(
            range(1, transcript["last_seq"] + 1)
        )
        assert with_log.json()["events"][0]["type"] == "turn.started"
        assert with_log.json()["events"][0]["at"] > 0
        bad_flag = await served.client.get(
            served.path("calc", "s0", "transcript"), params={"events": "yes"}, headers=ALICE
        )
        assert bad_flag.status_code == 400 and bad_flag.json()["code"] == "invalid_parameter"
        logged = await runtime.session("calc", "s0").events()
        assert transcript["last_seq"] == logged[-1].seq
        assert [m["role"] for m in transcript["messages"]] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert (
            await served.client.get(served.path("calc", "s0", "pending"), headers=ALICE)
        ).json() == {"request": None, "requests": []}
        reset = await served.client.post(served.path("calc", "s0", "reset"), headers=ALICE)
        assert reset.json() == {
            "previous_session": "s0#g0",
            "archived_generation": 0,
            "generation": 1,
        }
        after = (
            await served.client.get(served.path("calc", "s0", "transcript"), headers=ALICE)
        ).json()
        # Event numbers carry on after the reset: a feed resumes past the old ones.
        assert after == {
            "status": "new",
            "generation": 1,
            "last_seq": transcript["last_seq"],
            "messages": [],
            "generations": [0],
            "usage": turnkit.Usage().to_dict(),  # the new generation has used nothing
            "turns": [],
        }
        # The archived generation stays readable, read-only, by its number.
        archived = await served.client.get(
            served.path("calc", "s0", "transcript"), params={"generation": "0"}, headers=ALICE
        )
        assert archived.status_code == 200
        assert archived.json() == {
            "status": "archived",
            "generation": 0,
            "messages": transcript["messages"],
        }
        for params, status in (({"generation": "1"}, 404), ({"generation": "x"}, 400)):
            refused = await served.client.get(
                served.path("calc", "s0", "transcript"), params=params, headers=ALICE
            )
            assert refused.status_code == status, refused.text
            if status == 404:
                assert refused.json()["code"] == "unknown_generation"
                assert "(archived: 0)" in refused.json()["error"]
        again = await served.client.post(served.path("calc", "s0", "reset"), headers=ALICE)
        assert again.json() == {
            "previous_session": None,
            "archived_generation": None,
            "generation": 1,
        }
        seen: list[str] = []
        cursor: str | None = None
        while True:
            params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
            page = (
                await served.client.get("/agents/calc/sessions", params=params, headers=ALICE)
            ).json()
            assert len(page["sessions"]) <= 2
            seen += [row["session_id"] for row in page["sessions"]]
            # Each row previews its first message (none for s0: reset since).
            for row in page["sessions"]:
                assert row["preview"] == (None if row["session_id"] == "s0" else "2+3?")
            cursor = page["next"]
            if cursor is None:
                break
        assert sorted(seen) == [f"s{n}" for n in range(5)] and len(set(seen)) == 5
        for bad in ({"limit": "0"}, {"limit": "x"}, {"cursor": "!!"}, {"limit": "201"}):
            reply = await served.client.get("/agents/calc/sessions", params=bad, headers=ALICE)
            assert reply.status_code == 400, bad
        agents = (await served.client.get("/agents", headers=ALICE)).json()
        assert agents == {"agents": [{"name": "calc"}], "notice": None}


async def test_events_after_a_number_and_for_one_turn(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime) as served:
        first = await served.client.post(
            served.path("calc", "s1", "chat"), json={"text": "a"}, headers=ALICE
        )
        turn_id = first.json()["turn_id"]
        await served.client.post(
            served.path("calc", "s1", "chat"), json={"text": "b"}, headers=ALICE
        )
        logged = [e.to_dict() for e in await runtime.session("calc", "s1").events()]
        one_turn = [e for e in logged if e["turn_id"] == turn_id]
        url = served.path("calc", "s1", "events")
        frames = await sse(
            served, "GET", url, params={"after": "3", "turn_id": turn_id}, headers=ALICE
        )
        assert [f.data for f in frames] == [e for e in one_turn if e["seq"] > 3]
        # Last-Event-ID wins over ?after=.
        frames = await sse(
            served,
            "GET",
            url,
            params={"after": "0", "turn_id": turn_id},
            headers={**ALICE, "Last-Event-ID": "5"},
        )
        assert [f.data["seq"] for f in frames] == [e["seq"] for e in one_turn if e["seq"] > 5]
        # After the turn's ending there is nothing more: the stream ends at once.
        assert (
            await sse(
                served,
                "GET",
                url,
                params={"after": str(one_turn[-1]["seq"]), "turn_id": turn_id},
                headers=ALICE,
            )
            == []
        )
        # The whole session's feed stays open: read what is logged, then hang up.
        async with aconnect_sse(
            served.client, "GET", url, params={"after": "2"}, headers={**ALICE}
        ) as source:
            got = []
            async for frame in source.aiter_sse():
                got.append(json.loads(frame.data))
                if len(got) == len(logged) - 2:
                    break
        assert got == logged[2:]
        for bad in ({"after": "-1"}, {"after": "x"}, {"turn_id": ""}):
            assert (await served.client.get(url, params=bad, headers=ALICE)).status_code == 400, bad
        unknown = await served.client.get(url, params={"turn_id": "nope"}, headers=ALICE)
        assert unknown.status_code == 404


async def test_a_client_that_drops_mid_turn_reconnects_to_exactly_the_missing_events(
    open_runtime: Any,
) -> None:
    gate = asyncio.Event()
    runtime = await open_runtime(gated_agent(gate, answer="It is 1.", chunks=3))
    async with serving(runtime) as served:
        before_drop = []
        async with aconnect_sse(
            served.client,
            "POST",
            served.path("w", "s1", "turns"),
            json={"text": "go"},
            headers={**ALICE},
        ) as source:
            async for frame in source.aiter_sse():
                before_drop.append(frame)
                if frame.event == "action.requested":
                    break  # the client drops here, mid-turn
        last_id = [f.id for f in before_drop if f.id][-1]
        turn_id = json.loads(before_drop[0].data)["turn_id"]
        gate.set()  # the turn goes on while nobody listens
        await runtime.session("w", "s1").result(turn_id)
        rest = await sse(
            served,
            "GET",
            served.path("w", "s1", "events"),
            params={"turn_id": turn_id},
            headers={**ALICE, "Last-Event-ID": last_id},
        )
    logged = [e.to_dict() for e in await runtime.session("w", "s1").events(turn_id=turn_id)]
    seen = [d for f in before_drop if (d := json.loads(f.data))["seq"]] + [f.data for f in rest]
    assert seen == logged  # every structural event once, in order
    assert rest[-1].event == "turn.completed"


async def test_a_feed_opened_mid_turn_joins_the_log_and_the_live_events(open_runtime: Any) -> None:
    gate = asyncio.Event()
    answer = "All done now, thanks for waiting."
    runtime = await open_runtime(gated_agent(gate, answer=answer, chunks=5))
    session = runtime.session("w", "s1")
    async with serving(runtime) as served:
        turn_id = session.start("go", owner="alice")
        await eventually(lambda: requested(session), what="the tool call requested")
        async with aconnect_sse(
            served.client,
            "GET",
            served.path("w", "s1", "events"),
            params={"turn_id": turn_id},
            headers={**ALICE},
        ) as source:
            frames = []
            async for frame in source.aiter_sse():
                frames.append(frame)
                if frame.event == "action.requested":
                    gate.set()
        got = decode(frames)
    logged = [e.to_dict() for e in await session.events(turn_id=turn_id)]
    assert [f.data for f in got if f.data["seq"]] == logged
    deltas = "".join(f.data["text"] for f in got if f.event == "message.delta")
    assert deltas == answer  # live text, once


async def test_bad_input_is_a_4xx_naming_the_problem_and_stores_nothing(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime, limits=ServerLimits(max_body_bytes=1024)) as served:
        turns = served.path("calc", "s1", "turns")
        json_headers = {**ALICE, "Content-Type": "application/json"}
        cases: list[tuple[str, str, dict[str, str], bytes, int, str]] = [
            ("POST", turns, json_headers, b"{not json", 400, "not JSON"),
            ("POST", turns, json_headers, b"[1, 2]", 400, "JSON object"),
            ("POST", turns, json_headers, b"{}", 400, "text is missing"),
            ("POST", turns, json_headers, b'{"text": 5}', 400, "text must be a string"),
            ("POST", turns, json_headers, b'{"text": "  "}', 400, "must not be empty"),
            ("POST", turns, json_headers, b'{"text": "hi", "extra": 1}', 400, "unknown field"),
            (
                "POST",
                turns,
                json_headers,
                b'{"text": "hi", "replace": "yes"}',
                400,
                "replace must be a boolean",
            ),
            (
                "POST",
                turns,
                json_headers,
                b'{"text": "hi", "turn_id": ""}',
                400,
                "turn_id must not be empty",
            ),
            ("POST", turns, json_headers, b'{"text": "a\\u0000b"}', 400, "NUL"),
            ("POST", turns, json_headers, b'{"text": "\\ud800"}', 400, "surrogate"),
            ("POST", turns, json_headers, b'{"text": NaN}', 400, "not JSON"),
            (
                "POST",
                turns,
                json_headers,
                b'{"text": "' + b"x" * 2000 + b'"}',
                413,
                "larger than the limit",
            ),
            (
                "POST",
                turns,
                {**ALICE, "Content-Type": "text/plain"},
                b'{"text": "hi"}',
                415,
                "application/json",
            ),
            (
                "POST",
                "/agents/nobody/sessions/s1/turns",
                json_headers,
                b'{"text": "hi"}',
                404,
                "no agent named",
            ),
            (
                "POST",
                served.path("calc", "s1", "reset"),
                json_headers,
                b'{"x": 1}',
                400,
                "takes no fields",
            ),
            (
                "POST",
                served.path("calc", "s1", "resume"),
                json_headers,
                b'{"turn_id": "t"}',
                400,
                "input_id is missing",
            ),
            (
                "POST",
                served.path("calc", "s1", "resume"),
                json_headers,
                b'{"turn_id": "t", "input_id": "i"}',
                400,
                "value is missing",
            ),
            ("GET", "/nowhere", ALICE, b"", 404, "Not Found"),
            ("DELETE", turns, ALICE, b"", 405, "Method Not Allowed"),
        ]
        for method, url, headers, body, status, words in cases:
            reply = await served.client.request(method, url, headers=headers, content=body)
            assert reply.status_code == status, (body, reply.text)
            assert words in reply.json()["error"], (body, reply.json())
            assert reply.json()["code"]
    assert await runtime.sessions() == []


async def test_a_turn_on_a_parked_session_is_a_409(open_runtime: Any) -> None:
    runtime = await open_runtime(refund_agent())
    async with serving(runtime) as served:
        await served.client.post(
            served.path("shop", "s1", "chat"), json={"text": "refund"}, headers=ALICE
        )
        before = await snapshot(runtime)
        again = await served.client.post(
            served.path("shop", "s1", "turns"), json={"text": "hi"}, headers=ALICE
        )
        assert again.status_code == 409 and "waiting for input" in again.json()["error"]
        assert await snapshot(runtime) == before


def test_create_app_refuses_a_missing_authenticate() -> None:
    runtime = turnkit.Runtime([calc_agent()], store=turnkit.stores.MemoryStore())
    from turnkit.server import create_app

    with pytest.raises(turnkit.ConfigurationError, match="authenticate"):
        create_app(runtime, authenticate=None)  # type: ignore[arg-type]
    with pytest.raises(turnkit.ConfigurationError, match="max_body_bytes"):
        ServerLimits(max_body_bytes=0)


async def test_a_client_that_hangs_up_leaves_the_turn_running(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime) as served:
        async with aconnect_sse(
            served.client,
            "POST",
            served.path("calc", "s1", "turns"),
            json={"text": "x"},
            headers={**ALICE},
        ) as source:
            async for _ in source.aiter_sse():
                break

        async def completed() -> list[Any]:
            events = await runtime.session("calc", "s1").events()
            return [e for e in events if e.type == "turn.completed"]

        await eventually(completed, what="the turn completed")
    with pytest.raises(httpx.ConnectError):
        await httpx.AsyncClient().get(served.url + "/agents")


async def test_quiet_streams_send_keep_alive_comments(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime, limits=ServerLimits(keepalive_seconds=0.05)) as served:
        await served.client.post(
            served.path("calc", "s1", "chat"), json={"text": "hi"}, headers=ALICE
        )
        raw = b""
        async with served.client.stream(
            "GET", served.path("calc", "s1", "events"), headers=ALICE, params={"after": "999"}
        ) as reply:
            assert reply.status_code == 200
            assert reply.headers["cache-control"] == "no-cache"
            async for chunk in reply.aiter_bytes():
                raw += chunk
                if raw.count(b": keep-alive\n") >= 2:
                    break
    assert raw.startswith(b": keep-alive\n")


async def test_a_feed_follows_a_turn_running_in_another_process_through_the_log(
    store_kind: str, make_store: Any, open_runtime: Any
) -> None:
    if store_kind == "memory":
        pytest.skip("two runtimes on one in-memory store share no log across processes")
    gate = asyncio.Event()
    # The worker runs the turn; the server is another runtime with its own sink.
    worker = await open_runtime(gated_agent(gate), store=make_store())
    front = await open_runtime(gated_agent(gate), store=make_store())
    front.sink = turnkit.LocalEventSink()
    session = worker.session("w", "s1")
    turn_id = session.start("go", owner="alice")
    await eventually(lambda: requested(session), what="the tool call requested")
    limits = ServerLimits(feed_poll_seconds=0.05)
    async with serving(front, limits=limits) as served:
        frames = []
        async with aconnect_sse(
            served.client,
            "GET",
            served.path("w", "s1", "events"),
            params={"turn_id": turn_id, "after": "1"},
            headers={**ALICE},
        ) as source:
            async for frame in source.aiter_sse():
                frames.append(json.loads(frame.data))
                if frame.event == "action.requested":
                    gate.set()
    logged = [e.to_dict() for e in await session.events(turn_id=turn_id)]
    # On PostgreSQL a delta of the last reply may come through the relay before the
    # feed reads its step from the log (live text, docs/server.md): it is then shown
    # in its place, before the message.completed it belongs to, and never after it.
    assert [f for f in frames if f["type"] != "message.delta"] == logged[1:]
    for i, frame in enumerate(frames):
        if frame["type"] == "message.delta":
            own = [f for f in frames[i + 1 :] if f.get("seq") == frame["next_seq"]]
            assert own and own[0]["type"] == "message.completed", frames
    assert frames[-1]["type"] == "turn.completed"


async def test_text_with_unicode_line_separators_stays_on_one_data_line(open_runtime: Any) -> None:
    # JSON leaves U+2028, U+2029 and U+0085 raw; httpx's line reader (and Python's
    # splitlines) breaks lines on them, which would cut the event's JSON in two.
    tricky = "one\u2028two\u2029three\x85four\r\nfive"
    agent = turnkit.Agent(
        name="echo",
        model=ScriptedModel(respond=lambda _: ScriptedReply(text=tricky, chunks=2)),
        instructions=".",
    )
    runtime = await open_runtime(agent)
    async with serving(runtime) as served:
        frames = await sse(
            served, "POST", served.path("echo", "s1", "turns"), json={"text": "hi"}, headers=ALICE
        )
        # A client reading the stream line by line with httpx's own line reader.
        async with served.client.stream(
            "POST", served.path("echo", "s2", "turns"), json={"text": "hi"}, headers=ALICE
        ) as reply:
            data = [
                json.loads(line.removeprefix("data: "))
                async for line in reply.aiter_lines()
                if line.startswith("data: ")
            ]
    assert data[-1]["type"] == "turn.completed" and data[-1]["text"] == tricky
    assert frames[-1].event == "turn.completed" and frames[-1].data["text"] == tricky
    assert "".join(f.data["text"] for f in frames if f.event == "message.delta") == tricky


def test_frame_splits_data_on_every_sse_line_break() -> None:
    from turnkit.server import frame

    assert frame("a\rb\r\nc\nd", event="x") == b"event: x\ndata: a\ndata: b\ndata: c\ndata: d\n\n"
    with pytest.raises(ValueError, match="line break"):
        frame("x", event="a\rb")


def test_a_keep_alive_after_a_numbered_event_is_no_event_to_a_python_client() -> None:
    """httpx-sse (against the SSE spec) hands out an empty event at a blank line once an
    event carried an ``id:``; the keep-alive sends none, so its clients see only events."""
    from httpx_sse import EventSource

    from turnkit.server._sse import KEEPALIVE, frame

    stream = frame("{}", event="turn.started", id="1") + KEEPALIVE + frame("{}", event="x")
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream)
    assert [e.event for e in EventSource(response).iter_sse()] == ["turn.started", "x"]


async def test_a_session_of_another_agent_is_a_409_and_stays_as_it_was(
    make_store: Any, open_runtime: Any
) -> None:
    first = await open_runtime(calc_agent(), refund_agent())
    await first.session("calc", "s1").turn("2+3?", owner="alice")
    # Another process (or this one after a restart): nothing in memory says whose
    # session s1 is, only the store does.
    runtime = await open_runtime(calc_agent(), refund_agent(), store=make_store())
    before = await snapshot(runtime)
    async with serving(runtime) as served:
        for method, verb, body in [
            ("POST", "chat", {"text": "hi"}),
            ("POST", "turns", {"text": "hi"}),
            ("POST", "resume", {"turn_id": "t", "input_id": "approve", "value": True}),
            ("POST", "reset", {}),
            ("GET", "pending", None),
            ("GET", "transcript", None),
            ("GET", "events", None),
        ]:
            reply = await served.client.request(
                method, served.path("shop", "s1", verb), json=body, headers=ALICE
            )
            assert reply.status_code == 409, (verb, reply.text)
            assert reply.json()["code"] == "session_of_another_agent", reply.text
            assert "belongs to agent 'calc'" in reply.json()["error"]
            assert await snapshot(runtime) == before
        mine = await served.client.get(served.path("calc", "s1", "transcript"), headers=ALICE)
        assert mine.status_code == 200 and mine.json()["status"] == "idle"


async def test_a_runtime_that_is_not_open_answers_503(make_store: Any) -> None:
    runtime = turnkit.Runtime([calc_agent()], store=make_store())
    async with serving(runtime) as served:
        for method, verb in [("POST", "chat"), ("POST", "reset"), ("GET", "transcript")]:
            reply = await served.client.request(
                method, served.path("calc", "s1", verb), json={"text": "hi"}, headers=ALICE
            )
            assert reply.status_code == 503, (verb, reply.text)
            assert reply.json()["code"] == "runtime_unavailable"
        anonymous = await served.client.post(served.path("calc", "s1", "chat"), json={})
        assert anonymous.status_code == 401  # authentication still comes first


async def test_a_failing_or_busy_store_is_a_503(open_runtime: Any, monkeypatch: Any) -> None:
    runtime = await open_runtime(calc_agent())
    session = runtime.session("calc", "s1")
    await session.turn("2+3?", owner="alice")
    store = session._store

    def busy() -> Any:
        raise turnkit.SessionBusyError("another process holds the writer lock of s1")

    monkeypatch.setattr(store, "writer", busy)
    async with serving(runtime) as served:
        reset = await served.client.post(served.path("calc", "s1", "reset"), headers=ALICE)
        assert reset.status_code == 503 and reset.json()["code"] == "session_busy", reset.text

        def down(session_id: str) -> Any:
            raise turnkit.StoreError("the database is unreachable")

        monkeypatch.setattr(runtime.store, "session", down)
        reply = await served.client.get(served.path("calc", "s1", "transcript"), headers=ALICE)
        assert reply.status_code == 503 and reply.json()["code"] == "store_unavailable"
        # The store's own words stay in the log: they may quote rows or name hosts.
        assert "unreachable" not in reply.text


async def test_head_on_the_event_feed_answers_the_headers_and_opens_no_feed(
    open_runtime: Any,
) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime) as served:
        await served.client.post(
            served.path("calc", "s1", "chat"), json={"text": "hi"}, headers=ALICE
        )
        # Bounded, so that a feed answering HEAD (it would never end) fails the test.
        reply = await served.client.head(
            served.path("calc", "s1", "events"), headers=ALICE, timeout=10
        )
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert (await served.client.head("/agents/calc/sessions/s1/events")).status_code == 401


async def test_the_chat_page_and_its_files_are_behind_authenticate_too(open_runtime: Any) -> None:
    runtime = await open_runtime(calc_agent())
    async with serving(runtime, chat_page=True) as served:
        for url in ("/", "/static/index.html"):
            anonymous = await served.client.get(url)
            assert anonymous.status_code == 401, url
            assert anonymous.json()["code"] == "unauthenticated"
            assert (await served.client.get(url, headers=ALICE)).status_code == 200, url
        for sneaky in ("/static/../_app.py", "/static/%2e%2e/_app.py", "/static/..%2f_app.py"):
            reply = await served.client.get(sneaky, headers=ALICE)
            assert reply.status_code == 404, (sneaky, reply.text)
            assert "create_app" not in reply.text


async def test_an_unexpected_error_is_a_500_that_keeps_its_details_in_the_log(
    open_runtime: Any,
) -> None:
    runtime = await open_runtime(calc_agent())

    def broken(request: Any) -> Any:
        raise RuntimeError("cannot reach postgresql://app:s3cret@db/prod")

    async with serving(runtime, authenticate=broken) as served:
        reply = await served.client.get("/agents")
    assert reply.status_code == 500 and reply.json()["code"] == "internal_error"
    assert "s3cret" not in reply.text and "RuntimeError" in reply.json()["error"]


def test_server_limits_refuse_booleans_for_numbers() -> None:
    for field in ("max_body_bytes", "keepalive_seconds", "page_size_max", "feed_poll_seconds"):
        with pytest.raises(turnkit.ConfigurationError, match=field):
            ServerLimits(**{field: True})


async def test_http_and_the_command_line_write_times_in_one_format(tmp_path: Any) -> None:
    """RFC 3339 UTC strings in every JSON body: the HTTP session list and
    ``turnkit sessions --json`` / ``turnkit show --json`` give the same text."""
    db = tmp_path / "times.db"
    agent = calc_agent()
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as runtime:
        await runtime.session("calc", "s1").turn("add", owner="alice")
        async with serving(runtime) as served:
            listed = (await served.client.get("/agents/calc/sessions", headers=ALICE)).json()
    rfc3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
    (row,) = listed["sessions"]
    assert rfc3339.fullmatch(row["updated_at"])
    command = [sys.executable, "-m", "turnkit.cli"]
    sessions = subprocess.run(
        [*command, "sessions", "--json", "--store", str(db)], capture_output=True, text=True
    )
    shown = subprocess.run(
        [*command, "show", "s1", "--json", "--store", str(db)], capture_output=True, text=True
    )
    assert json.loads(sessions.stdout)[0]["updated_at"] == row["updated_at"]
    (turn,) = json.loads(shown.stdout)["turns"]
    assert rfc3339.fullmatch(turn["created_at"]) and rfc3339.fullmatch(turn["finished_at"])
    assert turn["created_at"] <= turn["finished_at"] <= row["updated_at"]
