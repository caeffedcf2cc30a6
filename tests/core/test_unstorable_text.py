"""Text no store can keep (NUL, unpaired surrogates) from every way in: a person's
message, an inbound event, a trigger, a tool's arguments and result, an answer, the
model's reply. Each becomes U+FFFD where the value is made, so no commit fails and
no turn is wedged; over HTTP such text is refused with 400 and nothing is stored.
PostgreSQL is where it used to wedge, and it runs here too."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import StoreFactory
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from server_support import by_header, serving, snapshot

import turnkit
from turnkit import ToolContext, tool
from turnkit.server import ServerLimits
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

NUL, SURROGATE = "\x00", "\udc80"
BAD = f"a{NUL}b{SURROGATE}c"
CLEAN = "a\ufffdb\ufffdc"
ALICE = {"X-User": "alice"}


def hostile_agent() -> turnkit.Agent:
    """Echoes what it got into a tool's arguments, gets it back (with more bad text)
    from the tool, asks a question, and answers with all of it plus its own NUL."""

    @tool
    async def echo(text: str, ctx: ToolContext) -> dict[str, Any]:
        """Echoes."""
        answer = await ctx.request_input("ok", f"go on with {text}?")
        return {f"k{NUL}": text + SURROGATE, "answer": answer}

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage | turnkit.TriggerMessage):
            return ScriptedReply(
                text=f"looking{NUL}",
                tool_calls=[tool_call("echo", {"text": last.text + SURROGATE})],
            )
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(
            text=f"done{NUL}{SURROGATE} {json.dumps(last.result, ensure_ascii=False)}", chunks=3
        )

    return turnkit.Agent(
        name="h", model=ScriptedModel(respond=respond), instructions=".", tools=[echo]
    )


def has_unstorable(value: Any) -> bool:
    text = json.dumps(value, ensure_ascii=False)
    return NUL in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text)


async def test_item1_unstorable_text_from_every_way_in_is_kept_as_u_fffd(
    make_store: StoreFactory,
) -> None:
    """Every store, PostgreSQL included: each turn completes, nothing stored holds
    NUL or a surrogate, the session list and recovery work."""
    agent = hostile_agent()
    async with turnkit.Runtime([agent], store=make_store()) as runtime:
        slack = turnkit.InboundEvent(
            source="slack", text=BAD, channel_id=BAD, user=turnkit.User(id="U1", attested=True)
        )
        openings: list[tuple[str, dict[str, Any], str]] = [
            ("user", {}, f"bob{SURROGATE}"),
            ("slack", {"event": slack}, "U1"),
            ("cron", {"trigger": turnkit.Proactive(by=f"cron{NUL}")}, f"bob{NUL}"),
        ]
        for n, (how, options, by) in enumerate(openings):
            session = runtime.session("h", f"s{n}")
            turn_id = await session.submit(BAD, **options)
            parked = await session.result(turn_id)
            assert parked.status == "suspended", (how, parked)
            assert parked.request is not None and CLEAN in parked.request.prompt
            await session.resume(turn_id, "ok", {f"v{NUL}": [BAD]}, by=by)
            done = await session.result(turn_id)
            assert done.status == "completed", (how, done)
            assert done.text is not None and done.text.startswith("done\ufffd\ufffd")
            assert CLEAN in done.text
            stored = [m.to_dict() for m in await session.messages()]
            assert not has_unstorable(stored), how
            assert not has_unstorable([e.to_dict() for e in await session.events()]), how
        listed = await runtime.sessions()
        assert sorted(i.session_id for i in listed) == ["s0", "s1", "s2"]
        assert {i.preview for i in listed} == {CLEAN}
        assert await runtime.recover() == []


async def test_item1_a_tool_that_returns_its_own_input_with_bad_text_put_in_is_cleaned(
    make_store: StoreFactory,
) -> None:
    """A tool's input is a private copy it may change and return; what it put in is
    checked like any result (no check is skipped for a copy handed to a tool)."""

    @tool
    def mangle(data: dict[str, Any]) -> dict[str, Any]:
        """Returns its input, changed."""
        data["note"] = BAD
        data["items"].append(BAD)
        return data

    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("mangle", {"data": {"items": ["x"]}})]), "ok"]
    )
    agent = turnkit.Agent(name="m", model=model, tools=[mangle])
    async with turnkit.Runtime(agent, store=make_store()) as runtime:
        session = runtime.session("m", "s1")
        assert await session.turn("go") == "ok"
        [result] = [m.result for m in await session.messages() if m.role == "tool"]
        assert result == {"items": ["x", CLEAN], "note": CLEAN}
        assert not has_unstorable([e.to_dict() for e in await session.events()])


async def test_item1_the_session_list_survives_a_stored_nul_on_postgres(
    pg_dsn: str, pg_schema: str
) -> None:
    """A row written before the rule (a message body whose text holds an escaped NUL,
    which PostgreSQL cannot extract as text) must not break a listing: not the
    store's, not the HTTP list, not the page of sessions around it."""
    import psycopg

    from turnkit.stores import PostgresStore

    agent = hostile_agent()
    store = PostgresStore(pg_dsn, schema=pg_schema)
    async with turnkit.Runtime([agent], store=store) as runtime:
        for n in range(3):
            session = runtime.session("h", f"s{n}")
            await session.result(await session.submit(f"hello {n}", owner="alice"))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{pg_schema}".turnkit_messages SET body = %s '
                "WHERE session_id = %s AND idx = 0",
                (json.dumps({"role": "user", "turn_id": "x", "text": "bad\u0000row"}), "s1"),
            )
        previews = {i.session_id: i.preview for i in await runtime.sessions()}
        assert previews["s1"] == "bad\ufffdrow"
        async with serving(runtime, authenticate=by_header) as served:
            page = await served.client.get("/agents/h/sessions", headers=ALICE)
            assert page.status_code == 200, page.text
            assert [r["session_id"] for r in page.json()["sessions"]] == ["s2", "s1", "s0"]


# -- the fuzz test: arbitrary Unicode through every way in, on every store -------------

#: Any code point, surrogates and NUL included, short strings and long.
hostile = st.text(alphabet=st.characters(exclude_categories=()), max_size=200)


@pytest.fixture
def rig(make_store: StoreFactory) -> Iterator[tuple[asyncio.Runner, Any]]:
    """A runtime on the store under test, served over HTTP, kept across the fuzz
    examples in one event loop (a new store per example would cost seconds)."""
    runner = asyncio.Runner()
    agent = hostile_agent()
    runtime = turnkit.Runtime([agent], store=make_store())
    runner.run(runtime.__aenter__())
    # A body cap large enough for the 1 MB example (the cap itself is tested elsewhere).
    served_cm = serving(
        runtime, authenticate=by_header, limits=ServerLimits(max_body_bytes=8 << 20)
    )
    served = runner.run(served_cm.__aenter__())
    try:
        yield runner, served
    finally:
        runner.run(served_cm.__aexit__(None, None, None))
        runner.run(runtime.__aexit__(None, None, None))
        runner.close()


_counter = iter(range(10**9))


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=hostile)
@example(text=NUL)
@example(text=SURROGATE)
@example(text=("x" * 1_000_000) + NUL)
def test_fuzz_arbitrary_unicode_through_every_way_in(
    rig: tuple[asyncio.Runner, Any], text: str
) -> None:
    runner, served = rig
    runner.run(_one_example(served, text, next(_counter)))


async def _one_example(served: Any, text: str, n: int) -> None:
    runtime: turnkit.Runtime = served.runtime
    client: httpx.AsyncClient = served.client
    # Over HTTP: a 2xx or a 4xx naming what was wrong, never a 5xx; a refusal stores
    # nothing at all.
    before = await snapshot(runtime)
    body = json.dumps({"text": text, "turn_id": f"http-{n}"})  # escapes, so any text goes
    reply = await client.post(
        f"/agents/h/sessions/http{n}/chat",
        content=body,
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        assert await snapshot(runtime) == before
    else:
        assert reply.json()["status"] == "suspended"
    # In process, as Slack, MCP, a schedule or the developer's code would: a 4xx is
    # not an option there, so the turn must run to its end with the text made storable.
    session = runtime.session("h", f"code{n}")
    opening = text if text.strip() else "x"
    turn_id = await session.submit(
        opening,
        event=turnkit.InboundEvent(
            source="slack", text=opening, user=turnkit.User(id="U1", attested=True)
        ),
    )
    assert (await session.result(turn_id)).status == "suspended"
    await session.resume(turn_id, "ok", {"v": text}, by="U1")
    done = await session.result(turn_id)
    assert done.status == "completed", done
    assert not has_unstorable([m.to_dict() for m in await session.messages()])
    listed = await client.get("/agents/h/sessions", headers=ALICE)
    assert listed.status_code == 200, listed.text


# -- item 11: an event type this version does not know --------------------------------


async def test_item11_an_unknown_event_type_is_kept_and_forwarded(
    store_kind: str, make_store: StoreFactory, request: pytest.FixtureRequest
) -> None:
    """A newer turnkit (mid rolling upgrade) logged an event type this one does not
    know: the transcript still reads, the feed forwards it by its own name and goes
    on, and the next turn runs."""
    if store_kind == "memory":
        pytest.skip("a future event is planted with SQL: the in-memory store has none")
    agent = turnkit.Agent(
        name="e", model=ScriptedModel(respond=lambda t: f"echo {t[-1].text}"), instructions="."
    )
    store = make_store()
    async with turnkit.Runtime([agent], store=store) as runtime:
        session = runtime.session("e", "s1")
        await session.turn("first", owner="alice")
        seq = max(e.seq or 0 for e in await session.events()) + 1
        future = {
            "type": "future.thing",
            "turn_id": "t-future",
            "session_id": "s1",
            "seq": seq,
            "at": 1.0,
            "payload": {"x": [1, 2]},
        }
        row = ("s1", seq, "t-future", json.dumps(future))
        if store_kind == "sqlite":
            import sqlite3

            with sqlite3.connect(store.path) as conn:  # type: ignore[attr-defined]
                conn.execute("INSERT INTO turnkit_events VALUES (?, ?, ?, ?)", row)
        else:
            import psycopg

            schema = request.getfixturevalue("pg_schema")
            with psycopg.connect(request.getfixturevalue("pg_dsn"), autocommit=True) as conn:
                conn.execute(
                    f'INSERT INTO "{schema}".turnkit_events (session_id, seq, turn_id, body) '
                    "VALUES (%s, %s, %s, %s)",
                    row,
                )
        events = await session.events()
        assert isinstance(events[-1], turnkit.UnknownEvent)
        assert events[-1].name == "future.thing" and events[-1].to_dict() == future
        async with serving(runtime, authenticate=by_header) as served:
            path = "/agents/e/sessions/s1"
            shown = await served.client.get(f"{path}/transcript?events=true", headers=ALICE)
            assert shown.status_code == 200, shown.text
            assert shown.json()["events"][-1] == future
            # The feed forwards it under its own name, then the next turn's events.
            frames: list[tuple[str, str]] = []
            async with served.client.stream(
                "GET", f"{path}/events", params={"after": seq - 1}, headers=ALICE
            ) as feed:
                second = asyncio.create_task(session.turn("second", owner="alice"))
                name = ""
                async for line in feed.aiter_lines():
                    if line.startswith("event: "):
                        name = line.removeprefix("event: ")
                    elif line.startswith("data: "):
                        frames.append((name, line.removeprefix("data: ")))
                        if name == "turn.completed":
                            break
                assert await asyncio.wait_for(second, 30) == "echo second"
        assert frames[0] == ("future.thing", json.dumps(future, separators=(",", ":")))
        assert [n for n, _ in frames][-1] == "turn.completed"
