"""Issue 28 item 5: a turn taken over mid-reply streams its step again from the
start. Each delivery names its attempt on its deltas, so a feed drops the text of
the attempt that died and shows every word once (checked here for the engine, the
relay's wire and the Slack renderer; the chat page applies the same rule)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from httpx_sse import aconnect_sse
from server_support import serving
from streaming_support import STREAMING_AGENT, slow_pieces, start_streaming_worker

import turnkit
from turnkit.slack._pacing import EditPacer
from turnkit.slack._render import SlackReply, SlackThread
from turnkit.stores import PostgresStore, SqliteStore
from turnkit.stores.postgres._relay_wire import delta_entry, delta_from
from turnkit.testing import RecordingSink

WORDS = [f"w{n} " for n in range(10)]


class DiesMidReply:
    """Streams three words and fails (the first delivery, as a process that died);
    the next call streams the whole reply."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, messages: Any, tools: Any, *, system: str | None) -> Any:
        self.calls += 1
        for word in WORDS if self.calls > 1 else WORDS[:3]:
            yield turnkit.TextDelta(text=word)
        if self.calls == 1:
            raise RuntimeError("the process running it died")
        yield turnkit.ModelDone(reply=turnkit.ModelReply(text="".join(WORDS)))


async def two_attempts(tmp_path: Any) -> list[turnkit.TurnEvent]:
    sink = RecordingSink()
    agent = turnkit.Agent(name="a", model=DiesMidReply(), instructions=".")
    async with turnkit.Runtime([agent], store=SqliteStore(tmp_path / "t.db"), sink=sink) as rt:
        session = rt.session("a", "s1")
        turn_id = session.start("talk")
        assert (await session.result(turn_id)).status == "failed"
        session.start("talk", turn_id=turn_id)  # delivered again: the same step, anew
        assert (await session.result(turn_id)).text == "".join(WORDS)
    return sink.events


async def test_each_delivery_names_its_attempt_on_its_deltas(tmp_path: Any) -> None:
    events = await two_attempts(tmp_path)
    deltas = [e for e in events if isinstance(e, turnkit.MessageDeltaEvent)]
    attempts = list(dict.fromkeys(d.attempt for d in deltas))
    assert len(attempts) == 2 and None not in attempts
    assert [d.text for d in deltas if d.attempt == attempts[0]] == WORDS[:3]
    assert [d.text for d in deltas if d.attempt == attempts[1]] == WORDS
    # The relay carries the attempt across processes (and reads an older sender's).
    assert delta_from(delta_entry(deltas[0])) == deltas[0]
    old = delta_entry(deltas[0])[:7]
    assert delta_from(old).attempt is None


class FakeSlackClient:
    """The two Web API calls a reply makes, each message's text as last shown."""

    def __init__(self) -> None:
        self.shown: dict[str, str] = {}
        #: Every text a message showed, in order (what a person saw on the way).
        self.history: list[str] = []

    async def chat_postMessage(self, **kw: Any) -> dict[str, Any]:
        ts = f"{len(self.shown) + 1}.0"
        self.shown[ts] = kw["text"]
        self.history.append(kw["text"])
        return {"ts": ts}

    async def chat_update(self, **kw: Any) -> dict[str, Any]:
        self.shown[kw["ts"]] = kw["text"]
        self.history.append(kw["text"])
        return {"ts": kw["ts"]}


@pytest.mark.parametrize("cut", [1, 2, 3])
async def test_a_slack_reply_shows_each_word_once_across_a_takeover(
    tmp_path: Any, cut: int
) -> None:
    events = await two_attempts(tmp_path)
    first = next(e for e in events if isinstance(e, turnkit.MessageDeltaEvent))
    # The follower heard only ``cut`` deltas of the first attempt before it died.
    heard = [
        e
        for e in events
        if not (
            isinstance(e, turnkit.MessageDeltaEvent)
            and e.attempt == first.attempt
            and e.text in WORDS[cut:]
        )
        and e.type != "turn.failed"
    ]
    client = FakeSlackClient()
    reply = SlackReply(client, SlackThread(channel="C1"), EditPacer(0.0))  # type: ignore[arg-type]

    async def stream() -> Any:
        for event in heard:
            yield event

    await reply.render(stream())
    (text,) = client.shown.values()
    assert text.split() == [w.strip() for w in WORDS]
    # Every edit along the way (one per delta: no pacing here) shows each word at
    # most once: the dead attempt's words go when the new attempt's first comes.
    assert len(client.history) >= len(WORDS)
    for shown in client.history:
        words = shown.split()
        assert len(words) == len(set(words)), shown


@pytest.mark.slow
async def test_a_worker_killed_mid_reply_shows_no_word_twice_on_the_http_node(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    """The issue's case, with real processes: an HTTP node (a ``RuntimeClient``)
    streams a worker's reply; the worker is SIGKILLed after two pieces; a second
    worker takes the turn over and streams the step from its start. The node's
    stream tells the attempts apart, so a client applying the rule shows every
    piece once, and the logged reply is whole."""
    pieces = slow_pieces()

    def start_worker() -> subprocess.Popen[str]:
        return start_streaming_worker(pg_dsn, pg_schema, tmp_path, "--poll", "0.2")

    store = PostgresStore(pg_dsn, schema=pg_schema)
    runtime = turnkit.RuntimeClient(turnkit.load_agent(STREAMING_AGENT), store=store)
    workers: list[subprocess.Popen[str]] = []
    frames: list[dict[str, Any]] = []
    async with runtime, serving(runtime) as served:
        try:
            workers.append(await asyncio.to_thread(start_worker))
            path = served.path("streaming", "s1", "turns")
            async with aconnect_sse(
                served.client, "POST", path, json={"text": "hi"}, headers={"X-User": "alice"}
            ) as source:
                async for sse in source.aiter_sse():
                    frames.append(sse.json())
                    deltas = [f for f in frames if f["type"] == "message.delta"]
                    if sse.event != "message.delta":
                        continue
                    index = pieces.index(frames[-1]["text"])
                    if len(deltas) == 2:  # two pieces shown: the first worker dies
                        workers[0].kill()
                        await asyncio.to_thread(workers[0].wait, 30)
                        workers.append(await asyncio.to_thread(start_worker))
                    elif len(deltas) == 1 or index > 0:
                        (tmp_path / f"seen-{index}").touch()  # the next piece may go
        finally:
            for proc in workers:
                if proc.poll() is None:
                    proc.terminate()
                    await asyncio.to_thread(proc.wait, 30)
    deltas = [f for f in frames if f["type"] == "message.delta"]
    attempts = list(dict.fromkeys(d["attempt"] for d in deltas))
    assert len(attempts) == 2, deltas
    shown = ""
    current = None
    for delta in deltas:  # the rule the chat page and Slack apply
        if current is not None and delta["attempt"] != current:
            shown = ""
        current = delta["attempt"]
        shown += delta["text"]
        for piece in pieces:
            assert shown.count(piece) <= 1
    assert frames[-1]["type"] == "turn.completed"
    assert frames[-2]["message"]["text"] == "".join(pieces)
