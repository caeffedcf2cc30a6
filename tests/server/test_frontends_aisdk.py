"""The AI SDK's own chat client (``ai``: ``AbstractChat`` over ``DefaultChatTransport``)
against turnkit's AI SDK endpoints on a real hypercorn server: two tools, an approval
answered through the SDK's tool-approval response, a refused one, a connection
dropped mid-reply and resumed from the durable log, and a durable stop."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from frontend_support import NodeClient, StoryModel, node_or_skip, noted, shop_agent
from server_support import Served, serving
from streaming_support import STREAMING_AGENT, slow_pieces, start_streaming_worker

import turnkit
from turnkit.server.aisdk import ai_sdk
from turnkit.stores import PostgresStore, SqliteStore


@pytest.fixture
async def shop(tmp_path: Path) -> AsyncIterator[tuple[Served, StoryModel]]:
    node_or_skip()
    model = StoryModel()
    runtime = turnkit.Runtime(shop_agent(model), store=SqliteStore(tmp_path / "shop.db"))
    async with runtime, serving(runtime, frontends=[ai_sdk()]) as served:
        try:
            yield served, model
        finally:
            model.gate.set()  # a test that failed while the model waited lets it end
            for client in NodeClient.started:
                await client.close()


async def run(served: Served, scenario: str, chat: str, user: str = "ann") -> NodeClient:
    return await NodeClient.start("aisdk_client.mjs", scenario, served.url, "shop", user, chat)


def assistant_texts(result: dict[str, Any]) -> list[str]:
    last = result["messages"][-1]
    assert last["role"] == "assistant"
    return [p["text"] for p in last["parts"] if p["type"] == "text"]


def tools_of(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    last = result["messages"][-1]
    return {p["toolCallId"]: p for p in last["parts"] if p.get("toolCallId")}


async def status_of(served: Served, chat: str) -> str:
    return await served.runtime.store.session(chat).status()


async def test_a_turn_with_two_tools(shop: tuple[Served, StoryModel]) -> None:
    served, _ = shop
    client = await run(served, "two-tools", "c-tools")
    result = await client.result()
    assert result["status"] == "ready" and result["error"] is None
    assert assistant_texts(result) == ["Let me look. ", "A widget weighs 2 kg and costs 3 EUR. "]
    tools = tools_of(result)
    assert {k: (v["toolName"], v["state"], v["output"]) for k, v in tools.items()} == {
        "call_weigh": ("weigh", "output-available", "widget: 2 kg"),
        "call_price": ("price", "output-available", "widget: 3 EUR"),
    }
    assert tools["call_weigh"]["input"] == {"item": "widget"}
    # The assistant message is the turn: its id is the turn id the store keeps.
    turn_id = result["messages"][-1]["id"]
    record = await served.runtime.store.session("c-tools").turn(turn_id)
    assert record is not None and record.status == "completed"


async def test_a_park_is_answered_through_the_sdks_tool_approval(
    shop: tuple[Served, StoryModel],
) -> None:
    served, _ = shop
    client = await run(served, "approve", "c-approve")
    asked = await client.until("asked")
    assert asked["approvals"] == ["approve-refund"]
    result = await client.result()
    assert result["error"] is None
    assert assistant_texts(result) == ["Asking first. ", "Done: A-1 refunded. "]
    part = tools_of(result)["call_refund"]
    assert (part["state"], part["output"]) == ("output-available", "A-1 refunded")
    assert part["approval"]["approved"] is True
    events = await served.runtime.store.session("c-approve").events()
    answered = [e for e in events if isinstance(e, turnkit.InputAnsweredEvent)]
    assert [(e.by, e.value) for e in answered] == [("ann", True)]


async def test_an_answer_from_someone_not_named_is_refused(
    shop: tuple[Served, StoryModel],
) -> None:
    served, _ = shop
    client = await run(served, "refuse", "c-refuse")
    await client.until("asked")
    result = await client.result()
    assert result["status"] == "error"
    assert "not_an_answerer" in result["error"]
    # Nothing was applied: the turn still waits for the lead.
    assert await status_of(served, "c-refuse") == "suspended"
    events = await served.runtime.store.session("c-refuse").events()
    assert not [e for e in events if isinstance(e, turnkit.InputAnsweredEvent)]


async def test_a_dropped_stream_resumes_from_the_log_with_every_word_once(
    shop: tuple[Served, StoryModel],
) -> None:
    served, model = shop
    client = await run(served, "drop", "c-drop")
    seen = await client.until("seen")
    assert seen["text"] == "Once upon a time, "
    dropped = await client.until("dropped")
    assert dropped["status"] == "error"  # the SDK saw a network error
    reconnected = await client.until("response")  # the reconnect's GET
    assert (reconnected["method"], reconnected["status"]) == ("GET", 200)
    model.gate.set()  # only now does the reply go on
    result = await client.result()
    assert result["status"] == "ready" and result["error"] is None
    assert assistant_texts(result) == ["Once upon a time, there was a durable turn.", "The end. "]
    assert tools_of(result)["call_note"]["output"] == "noted"
    assert await status_of(served, "c-drop") == "idle"


async def test_stop_cancels_the_turn_durably(shop: tuple[Served, StoryModel]) -> None:
    served, model = shop
    before = len(noted)
    client = await run(served, "stop", "c-stop")
    stopped = await client.until("stopped")
    assert stopped["status"] == 200 and len(stopped["body"]["cancelled"]) == 1
    model.gate.set()  # the model step ends; the turn stops at that boundary
    result = await client.result()
    assert result["error"] is None
    turn_id = stopped["body"]["cancelled"][0]
    record = await served.runtime.store.session("c-stop").turn(turn_id)
    assert record is not None and record.status == "cancelled"
    assert len(noted) == before  # the tool the model asked for never ran


async def test_reconnecting_to_a_chat_with_nothing_running_is_204(
    shop: tuple[Served, StoryModel],
) -> None:
    served, _ = shop
    url = "/agents/shop/ai-sdk/chat/nothing-here/stream"
    assert (await served.client.get(url, headers={"X-User": "ann"})).status_code == 204
    assert (await served.client.get(url)).status_code == 401


async def test_a_dropped_stream_resumes_on_another_http_node_while_a_worker_runs_the_turn(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    """Two HTTP nodes (``RuntimeClient``) and a worker on one PostgreSQL: the chat
    posts to one node, drops mid-reply and reconnects to the other, which serves the
    turn from the log and the rest of the reply through the store's relay."""
    node_or_skip()
    model = StoryModel()

    def store() -> PostgresStore:
        return PostgresStore(pg_dsn, schema=pg_schema, busy_timeout=10.0)

    worker_runtime = turnkit.Runtime(shop_agent(model), store=store())
    node_a, node_b = (turnkit.RuntimeClient(shop_agent(model), store=store()) for _ in "ab")
    async with worker_runtime, node_a, node_b:
        worker = turnkit.Worker(worker_runtime, concurrency=4)
        working = asyncio.create_task(worker.run())
        try:
            async with (
                serving(node_a, frontends=[ai_sdk()]) as a,
                serving(node_b, frontends=[ai_sdk()]) as b,
            ):
                client = await NodeClient.start(
                    "aisdk_client.mjs", "drop", a.url, "shop", "ann", "c-nodes", b.url
                )
                try:
                    assert (await client.until("seen"))["text"] == "Once upon a time, "
                    await client.until("dropped")
                    reconnected = await client.until("response")
                    assert (reconnected["method"], reconnected["status"]) == ("GET", 200)
                    model.gate.set()
                    result = await client.result()
                finally:
                    model.gate.set()
                    await client.close()
        finally:
            worker.stop()
            await asyncio.wait_for(working, 30)
    assert result["status"] == "ready" and result["error"] is None
    assert assistant_texts(result) == ["Once upon a time, there was a durable turn.", "The end. "]


@pytest.mark.slow
async def test_a_worker_killed_mid_reply_leaves_the_sdk_every_word_once(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    """The AI SDK's client streams a reply from an HTTP node while a worker runs the
    turn; the worker is SIGKILLed after two pieces, a second one takes the turn over
    and streams the step again. The part the dead attempt drew is marked superseded,
    and the parts left to show hold the reply once."""
    node_or_skip()
    pieces = slow_pieces()

    def start_worker() -> subprocess.Popen[str]:
        return start_streaming_worker(pg_dsn, pg_schema, tmp_path, "--poll", "0.2")

    store = PostgresStore(pg_dsn, schema=pg_schema)
    runtime = turnkit.RuntimeClient(turnkit.load_agent(STREAMING_AGENT), store=store)
    workers: list[subprocess.Popen[str]] = []
    async with runtime, serving(runtime, frontends=[ai_sdk()]) as served:
        client = await NodeClient.start(
            "aisdk_client.mjs", "watch", served.url, "streaming", "alice", "c-takeover"
        )
        try:
            workers.append(await asyncio.to_thread(start_worker))
            seen = 0  # pieces shown so far, over both attempts
            state = (0, 0)
            while seen < len(pieces) + 2:
                parts = (await client.until("text"))["parts"]
                live = [p["text"] for p in parts if not p["superseded"]]
                count = pieces_in(live[-1] if live else "", pieces)
                if count == 0 or (len(parts), count) == state:
                    continue
                state = (len(parts), count)
                seen += 1
                if seen == 2:  # two pieces shown: the first worker dies
                    workers[0].kill()
                    await asyncio.to_thread(workers[0].wait, 30)
                    workers.append(await asyncio.to_thread(start_worker))
                else:
                    (tmp_path / f"seen-{count - 1}").touch()  # the next piece may go
            result = await client.result()
        finally:
            await client.close()
            for proc in workers:
                if proc.poll() is None:
                    proc.terminate()
                    await asyncio.to_thread(proc.wait, 30)
    last = result["messages"][-1]
    texts = [p for p in last["parts"] if p["type"] == "text"]
    shown = [p["text"] for p in texts if not (p.get("providerMetadata") or {}).get("turnkit")]
    assert shown == ["".join(pieces)]
    superseded = [p["text"] for p in texts if (p.get("providerMetadata") or {}).get("turnkit")]
    assert superseded == ["".join(pieces[:2])]


def pieces_in(text: str, pieces: list[str]) -> int:
    """How many of the reply's pieces ``text`` holds (it must be a run of them)."""
    for k in range(len(pieces), -1, -1):
        if text == "".join(pieces[:k]):
            return k
    raise AssertionError(
        f"the client shows text that is no run of the reply's pieces: {text[:80]!r}"
    )


@pytest.mark.parametrize(
    ("scenario", "chat", "decision", "output"),
    [
        ("ship-approve", "c-ship-ok", turnkit.Decision.approve(), "A-7 shipped to Old Road 1"),
        (
            "ship-reject",
            "c-ship-no",
            turnkit.Decision.reject("no stock"),
            "ship did not run: the person reviewing the call rejected it. Reason: no stock",
        ),
    ],
)
async def test_a_decision_is_approved_or_rejected_through_the_sdks_tool_approval(
    shop: tuple[Served, StoryModel],
    scenario: str,
    chat: str,
    decision: turnkit.Decision,
    output: str,
) -> None:
    served, _ = shop
    client = await run(served, scenario, chat)
    asked = await client.until("asked")
    assert asked["approvals"] == ["approve-ship@call_ship"]
    result = await client.result()
    assert result["error"] is None
    part = tools_of(result)["call_ship"]
    assert (part["state"], part["output"]) == ("output-available", output)
    (record,) = await served.runtime.session("shop", chat).answers()
    assert (record.decision, record.by, record.source) == (decision, "ann", "aisdk")
