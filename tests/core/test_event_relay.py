"""Live events across processes on PostgreSQL: deltas relayed over LISTEN/NOTIFY.

The wire format is checked on its own (chunks under NOTIFY's limit, reassembled in
any order, never twice); then two stores on one schema relay a delta larger than
one notification; then a feed served by one process streams a turn running in
another, its text growing live and each delta in its place among logged events.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from httpx_sse import aconnect_sse
from psycopg import sql
from relay_child import PIECES
from server_support import serving
from streaming_support import STREAMING_AGENT, slow_pieces, start_streaming_worker
from suite_paths import CHILDREN

import turnkit
from turnkit import MessageDeltaEvent, ReasoningDeltaEvent, TurnCompletedEvent
from turnkit._seams.relay import Logged, Relayed
from turnkit.stores import PostgresStore
from turnkit.stores.postgres._relay_wire import (
    MAX_HELD_BYTES,
    MAX_PAYLOAD,
    PARTIAL_LIMIT,
    PARTIAL_TTL,
    Reassembler,
    delta_entry,
    delta_from,
    encode,
    failure_entry,
    relayed_from,
)
from turnkit.testing import ScriptedModel

CHILD = CHILDREN / "relay_child.py"
KEY = b"k" * 64
ALICE = {"X-User": "alice"}


def test_a_large_batch_is_cut_under_the_payload_limit_and_joined_in_any_order() -> None:
    text = "é€😀 " * 5000  # non-ASCII: 3-4 bytes each in UTF-8, escaped as ASCII
    delta = MessageDeltaEvent(turn_id="t1", session_id="s1", text=text, next_seq=4)
    payloads = encode(KEY, "app", "abc", 1, 12.5, [delta_entry(delta)])
    assert len(payloads) > 1
    assert all(len(p.encode()) <= MAX_PAYLOAD < 8000 for p in payloads)
    joined = Reassembler("app", "me", KEY)
    for payload in reversed(payloads[1:]):
        assert joined.add(payload) is None  # not whole yet
    batch = joined.add(payloads[0])
    assert batch is not None and (batch.sender, batch.number, batch.at) == ("abc", 1, 12.5)
    assert [delta_from(e) for e in batch.entries] == [delta]
    assert joined.add(payloads[0]) is None  # a batch is delivered once


def test_the_reassembler_skips_its_own_other_schemas_stale_batches_and_noise() -> None:
    entry = delta_entry(ReasoningDeltaEvent(turn_id="t", session_id="s", text="hm", next_seq=2))
    joined = Reassembler("app", "me", KEY)
    assert joined.add(encode(KEY, "app", "me", 1, 0.0, [entry])[0]) is None  # our own
    assert joined.add(encode(KEY, "other", "you", 1, 0.0, [entry])[0]) is None
    assert joined.add("not/ours") is None and joined.add("app/you/x/0/1/00/{}") is None
    assert joined.add(encode(KEY, "app", "you", 2, 0.0, [entry])[0]) is not None
    assert joined.add(encode(KEY, "app", "you", 1, 0.0, [entry])[0]) is None  # older than 2
    batch = joined.add(encode(KEY, "app", "you", 3, 0.0, [entry])[0])
    assert batch is not None
    assert delta_from(batch.entries[0]) == ReasoningDeltaEvent(
        turn_id="t", session_id="s", text="hm", next_seq=2
    )


FAILED_REPLY = turnkit.DeliveryFailedEvent(
    turn_id="t1",
    session_id="s1",
    channel="slack",
    target="C1",
    method="chat.update",
    error="token_revoked",
)


def test_a_failed_reply_crosses_whole_and_a_malformed_entry_is_refused() -> None:
    joined = Reassembler("app", "me", KEY)
    entries = [failure_entry(FAILED_REPLY), ["l", "s1", "t1", 4]]
    batch = joined.add(encode(KEY, "app", "you", 1, 0.0, entries)[0])
    assert batch is not None
    heard = [relayed_from(e) for e in batch.entries]
    assert heard == [FAILED_REPLY, Logged(session_id="s1", turn_id="t1", seq=4)]
    assert heard[0].at == FAILED_REPLY.at
    other_session = ["f", "s2", "t1", FAILED_REPLY.to_dict()]
    not_a_failure = [
        "f",
        "s1",
        "t1",
        TurnCompletedEvent(turn_id="t1", session_id="s1", text="x").to_dict(),
    ]
    for entry in (other_session, not_a_failure, ["x", "s1"]):
        with pytest.raises(ValueError):
            relayed_from(entry)


async def test_a_failed_reply_reaches_another_store(pg_dsn: str, pg_schema: str) -> None:
    """The Slack route and the chat page may be served by two processes: the page's
    feed hears of a Slack reply that failed in the other one."""
    async with following(pg_dsn, pg_schema) as (sender, _, heard):
        assert sender.relay is not None
        sender.relay.publish(FAILED_REPLY)
        assert await asyncio.wait_for(heard.get(), 10) == FAILED_REPLY


@asynccontextmanager
async def following(
    pg_dsn: str, pg_schema: str
) -> AsyncIterator[tuple[PostgresStore, PostgresStore, asyncio.Queue[Relayed]]]:
    """Two stores on one schema, the second's relay following session ``s1`` (and
    listening already): the sender, the receiver, and what the receiver heard."""
    sender, receiver = (PostgresStore(pg_dsn, schema=pg_schema) for _ in range(2))
    await sender.open()
    await receiver.open()
    try:
        assert sender.relay is not None and receiver.relay is not None
        heard: asyncio.Queue[Relayed] = asyncio.Queue()
        stop = receiver.relay.follow("s1", heard.put_nowait)
        await eventually(lambda: receiver.relay.listening, what="the relay listening")
        yield sender, receiver, heard
        stop()
    finally:
        await sender.close()
        await receiver.close()


def test_unfinished_batches_are_bounded_in_number_bytes_and_age() -> None:
    now = [0.0]
    joined = Reassembler("app", "me", KEY, clock=lambda: now[0])
    for number in range(1, 1000):
        first = encode(KEY, "app", "you", number, 0.0, [["d", "s", "t", "x", 1, "y" * 9000, 0]])[0]
        joined.add(first)  # never completed
    batches, held = joined.holding
    assert batches <= PARTIAL_LIMIT and held <= MAX_HELD_BYTES
    assert joined.rejected["stale"] == 999 - batches
    now[0] += PARTIAL_TTL + 1  # a batch whose chunks did not all come never will
    joined.add(encode(KEY, "app", "you", 5000, 0.0, [["l", "s", "t", 1]])[0])
    assert joined.holding == (0, 0)


def test_a_chunk_not_signed_with_the_key_is_dropped_and_counted() -> None:
    joined = Reassembler("app", "me", KEY)
    entry = ["l", "s1", "t1", 4]
    for forged in (
        encode(b"another key" * 4, "app", "you", 1, 0.0, [entry])[0],
        # The attack: one chunk claiming twenty million siblings.
        "app/you/1/0/20000000/" + "0" * 32 + "/{}",
    ):
        assert joined.add(forged) is None
    assert joined.rejected["forged"] == 2 and joined.holding == (0, 0)
    # Signed, but claiming more chunks than a batch may have: refused unheld.
    signed = "app/you/2/0/20000000/{}"
    from turnkit.stores.postgres._relay_wire import mac

    assert joined.add(f"app/you/2/0/20000000/{mac(KEY, signed)}/{{}}") is None
    assert joined.rejected["malformed"] == 1 and joined.holding == (0, 0)
    assert joined.add(encode(KEY, "app", "you", 3, 0.0, [entry])[0]) is not None


async def test_a_delta_larger_than_a_notification_reaches_another_store(
    pg_dsn: str, pg_schema: str
) -> None:
    sender, receiver = (PostgresStore(pg_dsn, schema=pg_schema) for _ in range(2))
    await sender.open()
    await receiver.open()
    try:
        assert sender.relay is not None and receiver.relay is not None
        heard: asyncio.Queue[Relayed] = asyncio.Queue()
        stop = receiver.relay.follow("s1", heard.put_nowait)
        receiver.relay.follow("s2", lambda item: pytest.fail(f"s2 heard {item}"))
        await eventually(lambda: receiver.relay.listening, what="the relay listening")
        sent = [
            MessageDeltaEvent(turn_id="t1", session_id="s1", text=t, next_seq=3)
            for t in ("Hel", "€" * 9000, "lo")
        ]
        logged = TurnCompletedEvent(turn_id="t1", session_id="s1", text="x", seq=3)
        for event in (*sent, logged):
            sender.relay.publish(event)
        got = [await asyncio.wait_for(heard.get(), 10) for _ in range(4)]
        assert got == [*sent, Logged(session_id="s1", turn_id="t1", seq=3)]
        # The sender does not hear itself.
        own: list[Relayed] = []
        sender.relay.follow("s1", own.append)
        await eventually(lambda: sender.relay.listening, what="the sender's relay listening")
        sender.relay.publish(sent[0])
        assert await asyncio.wait_for(heard.get(), 10) == sent[0]
        assert own == []
        stop()
    finally:
        await sender.close()
        await receiver.close()


async def test_relaying_can_be_turned_off(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresStore(pg_dsn, schema=pg_schema, relay_events=False)
    agent = turnkit.Agent(name="a", model=ScriptedModel(["hi"]))
    async with turnkit.Runtime(agent, store=store) as runtime:
        assert store.relay is None and runtime.relay is None
        session = runtime.session("a", "s")
        assert (await session.result(session.start("x"))).status == "completed"


def wait_line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line:
        _, err = child.communicate(timeout=10)
        pytest.fail(f"the child ended early: {err}")
    return line


@pytest.mark.slow
async def test_a_feed_streams_deltas_of_a_turn_running_in_another_process(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), pg_dsn, pg_schema, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert await asyncio.to_thread(wait_line, child) == "ready"
        # This process serves the feed and runs nothing: the child runs the turn.
        agent = turnkit.Agent(name="a", model=ScriptedModel([]))
        store = PostgresStore(pg_dsn, schema=pg_schema)
        async with turnkit.Runtime(agent, store=store) as runtime, serving(runtime) as served:
            last = (await runtime.session("a", "live").events())[-1].seq
            frames = await follow(served, last, store, tmp_path)
        assert await asyncio.to_thread(wait_line, child) == "completed"
    finally:
        child.kill()
        child.wait()
    kinds = [f["type"] for f in frames]
    first = kinds.index("message.completed")
    # The first step's delta is dropped if its step was logged before the feed got
    # to it (its message is then sent whole); if it came, it came in its place.
    assert kinds[:1] == ["turn.started"] and kinds[1:first] in ([], ["message.delta"])
    assert kinds[first:] == [
        "message.completed",
        "action.requested",
        "action.completed",
        *(["message.delta"] * 3),
        "message.completed",
        "turn.completed",
    ]
    answer = [f["text"] for f in frames[-5:-2]]
    assert answer == PIECES  # every piece once, in order, the large one whole
    assert frames[-2]["message"]["text"] == "".join(PIECES)
    seqs = [f["seq"] for f in frames if f["seq"] is not None]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))


async def follow(served: Any, after: int | None, store: PostgresStore, folder: Path) -> list[Any]:
    """The feed's frames up to ``turn.completed``; tells the child each answer piece
    was seen, so the next one may go."""
    frames: list[Any] = []
    path = served.path("a", "live", "events")

    async def read() -> None:
        async with aconnect_sse(
            served.client, "GET", path, params={"after": after}, headers=ALICE
        ) as source:
            async for sse in source.aiter_sse():
                frames.append(sse.json())
                if sse.event == "message.delta" and frames[-1]["text"] in PIECES:
                    index = PIECES.index(frames[-1]["text"])
                    (folder / f"seen-{index}").touch()
                if sse.event == "turn.completed":
                    return

    reading = asyncio.create_task(read())
    assert store.relay is not None
    await eventually(lambda: store.relay.listening, what="the relay listening")
    (folder / "go").touch()
    await asyncio.wait_for(reading, 60)
    return frames


class HandRelay:
    """A relay the test speaks through: ``say`` is what another process relayed."""

    def __init__(self) -> None:
        self.followers: list[Any] = []

    def publish(self, event: turnkit.TurnEvent) -> None:
        pass

    def follow(self, session_id: str, callback: Any) -> Any:
        self.followers.append(callback)
        return lambda: self.followers.remove(callback)

    def say(self, item: Relayed) -> None:
        for callback in self.followers:
            callback(item)


class GrowingLog:
    """A session store whose log shows events up to ``visible`` only: what another
    process has committed so far."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.visible = 0
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def events(self, **kwargs: Any) -> list[Any]:
        self.reads += 1
        return [e for e in await self._inner.events(**kwargs) if e.seq <= self.visible]


async def test_a_feed_places_relayed_deltas_among_the_logged_events() -> None:
    from turnkit.server._feed import EventFeed
    from turnkit.stores import MemoryStore
    from turnkit.testing import ScriptedReply, tool_call

    @turnkit.tool
    def look() -> str:
        """Looks."""
        return "seen"

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("look")]), "Done."])
    agent = turnkit.Agent(name="a", model=model, tools=[look])
    async with turnkit.Runtime(agent, store=MemoryStore()) as runtime:
        session = runtime.session("a", "s")
        turn_id = session.start("go")
        await session.result(turn_id)
        # Logged: 1 turn.started, 2 message.completed, 3 action.requested,
        # 4 action.completed, 5 message.completed, 6 turn.completed.
        log = GrowingLog(runtime.store.session("s"))
        log.visible = 1
        relay = HandRelay()
        feed = EventFeed(log, turnkit.LocalEventSink(), after=0, relay=relay)
        items = feed.events(idle=5)
        assert [e.seq for e in [await items.__anext__()]] == [1]

        def delta(text: str, place: int) -> MessageDeltaEvent:
            return MessageDeltaEvent(turn_id=turn_id, session_id="s", text=text, next_seq=place)

        # A delta of step 5 ahead of events 2-4 the feed has not sent: the log first.
        log.visible = 4
        relay.say(delta("Do", 5))
        relay.say(delta("ne.", 5))
        got = [await items.__anext__() for _ in range(5)]
        assert [(e.type, e.seq) for e in got[:3]] == [
            ("message.completed", 2),
            ("action.requested", 3),
            ("action.completed", 4),
        ]
        assert [e.text for e in got[3:]] == ["Do", "ne."]
        reads = log.reads
        # A late delta of a step already sent whole is dropped; a hint reads the log.
        relay.say(delta("stale", 2))
        log.visible = 6
        relay.say(Logged(session_id="s", turn_id=turn_id, seq=6))
        got = [await items.__anext__() for _ in range(2)]
        assert [(e.type, e.seq) for e in got] == [("message.completed", 5), ("turn.completed", 6)]
        assert log.reads == reads + 1  # the second delta of step 5 needed no read
        relay.say(delta("late", 5))  # its reply is logged now: dropped
        relay.say(Logged(session_id="s", turn_id=turn_id, seq=6))  # nothing new
        relay.say(delta("Next", 7))
        assert (await items.__anext__()) == delta("Next", 7)
        await items.aclose()
        assert relay.followers == []


@pytest.mark.slow
async def test_a_turn_posted_to_an_http_node_streams_a_workers_text_live(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    pieces = slow_pieces()
    store = PostgresStore(pg_dsn, schema=pg_schema)
    runtime = turnkit.RuntimeClient(turnkit.load_agent(STREAMING_AGENT), store=store)
    async with runtime, serving(runtime) as served:
        worker = await asyncio.to_thread(start_streaming_worker, pg_dsn, pg_schema, tmp_path)
        try:
            frames: list[Any] = []
            path = served.path("streaming", "s1", "turns")
            async with aconnect_sse(
                served.client, "POST", path, json={"text": "hi"}, headers=ALICE
            ) as source:
                async for sse in source.aiter_sse():
                    frames.append(sse.json())
                    if sse.event == "message.delta":
                        index = pieces.index(frames[-1]["text"])
                        (tmp_path / f"seen-{index}").touch()  # the next piece may go
        finally:
            worker.terminate()
            await asyncio.to_thread(worker.wait, 30)
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "turn.started" and kinds[-2:] == ["message.completed", "turn.completed"]
    live = [f["text"] for f in frames[1:-2]]
    # Each piece waited until the one before it was seen here, so the first two came
    # live; the last may lose its race with the reply's commit (then the logged
    # message carries it), but nothing comes twice or out of order.
    assert set(kinds[1:-2]) == {"message.delta"} and live == pieces[: len(live)]
    assert len(live) >= 2
    assert frames[-2]["message"]["text"] == "".join(pieces)


async def test_a_role_that_can_only_connect_cannot_forge_or_bloat_the_relay(
    pg_dsn: str, pg_schema: str
) -> None:
    """Issue 27 item 4: a role with CONNECT alone sent NOTIFYs each claiming
    20,000,000 chunks (the listener grew by 450 MiB) and a forged delta that reached
    a feed. Now both are dropped unheld, counted, and real events still arrive."""
    import psycopg

    role = f"turnkit_intruder_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        async with following(pg_dsn, pg_schema) as (sender, receiver, heard):
            assert sender.relay is not None and receiver.relay is not None
            forged_delta = json.dumps(
                {"at": 0.0, "e": [["d", "s1", "t1", "message.delta", 1, "FORGED", 0.0]]}
            )
            payloads = [f"{pg_schema}/evil/{n}/0/20000000/{'0' * 32}/x" for n in range(1, 4)]
            payloads.append(f"{pg_schema}/evil/9/0/1/{'0' * 32}/{forged_delta}")
            async with await psycopg.AsyncConnection.connect(
                pg_dsn, user=role, autocommit=True
            ) as intruder:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await intruder.execute(f'SELECT key FROM "{pg_schema}".turnkit_relay_key')
            async with await psycopg.AsyncConnection.connect(
                pg_dsn, user=role, autocommit=True
            ) as intruder:
                for payload in payloads:
                    await intruder.execute("SELECT pg_notify('turnkit_events', %s)", (payload,))
            await eventually(
                lambda: receiver.relay.rejected["forged"] >= len(payloads),
                what=lambda: f"every forged payload rejected: {receiver.relay.rejected}",
            )
            # A real delta after the forged ones is the first thing the follower hears.
            real = MessageDeltaEvent(turn_id="t1", session_id="s1", text="real", next_seq=1)
            sender.relay.publish(real)
            first = await asyncio.wait_for(heard.get(), 10)
            assert isinstance(first, MessageDeltaEvent) and first.text == "real"
            assert heard.empty()
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
