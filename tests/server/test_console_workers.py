"""The console's view of how turns ran (issue 38): on every store, a timeline shows
durable retries, deadlines, reminders and timers; on PostgreSQL it shows the worker
that committed each step and takeovers, and the live view lists the workers with
the sessions they hold, the step-latency histogram and takeovers from the
workers' metrics; on SQLite and memory it says there are no workers to show."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from console_takeover import Deployment, agent_folder, hold, release, take_over
from durable_time_support import HOUR, asking_agent, ended, fire, flaky_agent, parked
from server_support import serving
from test_console import VIEWER, by_role, operators
from test_ops import free_port

import turnkit
from turnkit.server import Console
from turnkit.server._console_data import timeline
from turnkit.stores import PostgresStore
from turnkit.testing import ScriptedModel


def steps(detail: dict[str, Any]) -> list[dict[str, Any]]:
    (turn,) = detail["turns"]
    return list(turn["timeline"])


async def test_a_timeline_shows_retries_deadlines_and_reminders(
    open_runtime: Any, store_kind: str
) -> None:
    calls: list[str] = []
    retry = turnkit.Retry(attempts=3, backoff=HOUR, on=(ConnectionError,))
    answers: list[Any] = []
    asking = asking_agent(answers, expires_in=HOUR, on_expiry="cancel", remind_every=900)
    flaky = flaky_agent(calls, fail=1, retry=retry)
    rt = await open_runtime(asking)
    flaky_rt = await open_runtime(flaky, store=rt.store)

    session = flaky_rt.session("a", "s-retry")
    first = await session.result(session.start("o-1"))
    await fire(flaky_rt, time.time() + 2 * HOUR)
    assert (await ended(session, first.turn_id)).status == "completed"
    asked = (await parked(rt.session("a", "s-ask"))).request
    assert asked is not None and asked.asked_at is not None
    assert await fire(rt, asked.asked_at + 901) == 1  # a reminder
    assert await fire(rt, asked.asked_at + HOUR + 1) == 1  # the deadline: cancelled

    async with serving(rt, authenticate=by_role, authorize=operators, console=Console()) as srv:
        got = await srv.client.get("/console/api/sessions/s-retry", headers=VIEWER)
        retried = steps(got.json())
        kinds = [i["kind"] for i in retried]
        assert kinds == ["model", "tool", "retry", "model", "end"], retried
        wait = retried[2]
        assert wait["label"] == f"retry 2 of {wait['label'].split(' of ')[1]}"
        assert "service down (1)" in wait["error"] and "attempt 1 of 3" in wait["error"]
        assert wait["by"] == "timer" and wait["end"] >= wait["start"]
        assert wait["retry_at"] > wait["start"]  # when it was due (the test fired it late)
        assert retried[1]["error"] is None and retried[1]["end"] is not None  # ran again, fine
        # Each model and tool step names its fork point (the reply's position).
        call_id = retried[1]["call_id"]
        assert [i["fork_at"] for i in retried] == [
            "model:1",
            f"tool:1:{call_id}",
            None,
            "model:3",
            None,
        ]

        got = await srv.client.get("/console/api/sessions/s-ask", headers=VIEWER)
        asked_steps = steps(got.json())
        assert [i["kind"] for i in asked_steps] == ["model", "tool", "park", "reminder", "end"]
        park = asked_steps[2]
        assert park["by"] == "deadline" and "deadline passed (cancel)" in park["label"]
        assert asked_steps[3]["label"] == "reminder 1: ok"
        assert asked_steps[-1]["label"] == "cancelled (expired)"

        live = (await srv.client.get("/console/api/live", headers=VIEWER)).json()
        detail = got.json()
        if store_kind == "postgres":
            # This process ran the turns, so it is each step's worker (it registered
            # as no worker: it ran them itself, not as a Worker).
            holder = rt.store.holder  # type: ignore[attr-defined]
            assert {i["worker"] for i in retried if i["kind"] in ("model", "end")} == {holder}
            assert detail["workers_recorded"] is True
            assert live["workers"] == {"recorded": True, "why": None, "workers": [], "orphaned": []}
        else:
            assert all(i["worker"] is None for i in retried)
            assert detail["workers_recorded"] is False
            assert live["workers"]["recorded"] is False
            assert "no worker registry" in live["workers"]["why"]
        metrics = (await srv.client.get("/console/api/metrics", headers=VIEWER)).json()
        assert metrics["sources"] == [{"source": "this process", "error": None}]


def test_a_takeover_is_found_between_two_writers() -> None:
    """The rule, on logged events: another process's delivery event with no park
    between is a takeover; after a park or an end, it is not."""
    base = {"turn_id": "t", "session_id": "s"}
    call = turnkit.ToolCall(id="c1", name="deploy", input={})
    ask = turnkit.AssistantMessage(text="", tool_calls=(call,), turn_id="t")
    events = [
        turnkit.TurnStartedEvent(**base, text="go", seq=1, at=10.0),
        turnkit.MessageCompletedEvent(**base, message=ask, seq=2, at=11.0),
        turnkit.ActionRequestedEvent(**base, call=call, seq=3, at=11.0),
        turnkit.ActionCompletedEvent(**base, call_id="c1", name="deploy", result=1, seq=4, at=19),
        turnkit.TurnCompletedEvent(**base, text="ok", seq=5, at=20.0),
    ]
    items = timeline(events, {1: "A", 2: "A", 3: "A", 4: "B", 5: "B"})
    assert [(i["kind"], i["worker"]) for i in items] == [
        ("model", "A"),
        ("tool", "B"),
        ("takeover", "B"),
        ("end", "B"),
    ]
    taken = items[2]
    assert (taken["from"], taken["start"], taken["end"]) == ("A", 11.0, 19)
    # Unknown writers (an older store, SQLite): no workers, no takeovers.
    assert [i["worker"] for i in timeline(events)] == [None] * 3


@pytest.mark.slow
async def test_workers_their_sessions_a_takeover_and_step_latency_on_postgresql(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    """Real ``turnkit worker`` processes: the first is SIGKILLed mid-tool, the second
    (with an ops port) takes the turn over; the console shows who ran each step,
    the takeover, the second worker holding a session, and its step latencies."""
    deployment = Deployment(agent_folder(tmp_path), pg_dsn, pg_schema)
    port = free_port()
    try:
        done = await asyncio.to_thread(take_over, deployment, "--ops-port", str(port))
        held_turn = await asyncio.to_thread(hold, deployment)
        store = PostgresStore(pg_dsn, schema=pg_schema)
        node = turnkit.RuntimeClient(turnkit.load_agent(deployment.folder), store=store)
        console = Console(metrics=[f"http://127.0.0.1:{port}/metrics"])
        async with (
            node,
            serving(node, authenticate=by_role, authorize=operators, console=console) as srv,
        ):
            c = srv.client
            items = steps((await c.get("/console/api/sessions/s-takeover", headers=VIEWER)).json())
            assert [(i["kind"], i["worker"]) for i in items] == [
                ("model", done.first),
                ("tool", done.second),
                ("takeover", done.second),
                ("model", done.second),
                ("end", done.second),
            ]
            assert items[2]["from"] == done.first

            workers = (await c.get("/console/api/live", headers=VIEWER)).json()["workers"]
            by_holder = {w["holder"]: w for w in workers["workers"]}
            # The killed worker said it was alive moments ago: it counts as live for
            # WORKER_ALIVE seconds, holding nothing.
            assert set(by_holder) == {done.first, done.second}
            held = by_holder[done.second]["sessions"]
            assert [(s["session_id"], s["turn_id"]) for s in held] == [("s-held", held_turn)]
            assert by_holder[done.first]["sessions"] == []
            assert by_holder[done.second]["agents"].keys() == {"ops"}

            metrics = (await c.get("/console/api/metrics", headers=VIEWER)).json()
            assert [s["error"] for s in metrics["sources"]] == [None, None]
            assert metrics["takeovers"] == 1
            # The second worker's steps: the model step after the tool, the tool of
            # s-held's... at least one model step timed between two commits.
            assert sum(metrics["kinds"]["model"]) >= 1
            assert len(metrics["bounds"]) == len(metrics["kinds"]["model"])
            assert metrics["bounds"][-1] is None  # +Inf
        await asyncio.to_thread(release, deployment, held_turn)
    finally:
        await asyncio.to_thread(deployment.stop)


def test_console_metrics_urls_are_checked() -> None:
    with pytest.raises(turnkit.ConfigurationError, match="http\\(s\\) URLs"):
        Console(metrics="http://127.0.0.1:9100/metrics")
    with pytest.raises(turnkit.ConfigurationError, match="http\\(s\\) URLs"):
        Console(metrics=["127.0.0.1:9100"])


async def test_sessions_filter_by_tenant(open_runtime: Any) -> None:
    """A session is listed under each tenant it has a turn of; the filter reads a
    page of sessions and asks the store about them at once, and pages by key."""
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: "ok"))
    rt = await open_runtime(agent)
    for n in range(5):
        await rt.session("a", f"acme-{n}").turn("hi", tenant="acme")
        await rt.session("a", f"globex-{n}").turn("hi", tenant="globex")
    await rt.session("a", "globex-0").turn("again", tenant="acme")  # now both
    await rt.session("a", "nobody").turn("hi")
    async with serving(
        rt, authenticate=by_role, authorize=operators, console=Console(page_size=4)
    ) as srv:

        async def listed(**params: Any) -> tuple[list[str], Any]:
            got = await srv.client.get("/console/api/sessions", params=params, headers=VIEWER)
            assert got.status_code == 200, got.text
            body = got.json()
            return [s["session_id"] for s in body["sessions"]], body["next"]

        first, after = await listed(tenant="acme")
        assert first == ["globex-0", "acme-4", "acme-3", "acme-2"]
        rest, end = await listed(tenant="acme", after=after)
        assert (rest, end) == (["acme-1", "acme-0"], None)
        assert (await listed(tenant="globex", status="idle"))[0] == [
            "globex-0",
            "globex-4",
            "globex-3",
            "globex-2",
        ]
        assert (await listed(tenant=""))[0] == ["nobody"]  # the default tenant
        assert (await listed(tenant="initech"))[0] == []
        detail = await srv.client.get("/console/api/sessions/globex-0", headers=VIEWER)
        assert [t["tenant"] for t in detail.json()["turns"]] == ["acme", "globex"]


async def test_each_event_names_the_process_that_wrote_it(pg_dsn: str, pg_schema: str) -> None:
    """PostgreSQL fills ``turnkit_events.holder`` from the connection's setting, even
    for a host name libpq must escape; the events a resume writes name its process."""
    store = PostgresStore(pg_dsn, schema=pg_schema)
    store.holder = "odd host\\name:1:x"
    answering = PostgresStore(pg_dsn, schema=pg_schema)
    answers: list[Any] = []
    async with (
        turnkit.Runtime([asking_agent(answers)], store=store) as rt,
        turnkit.Runtime([asking_agent(answers)], store=answering) as other,
    ):
        result = await parked(rt.session("a", "s1"))
        await other.session("a", "s1").resume(result.turn_id, "ok", {"approved": True})
        assert (await ended(other.session("a", "s1"), result.turn_id)).status == "completed"
        writers = await store.event_writers("s1")
        events = await rt.session("a", "s1").events()
        by_type = {e.type: writers.get(e.seq or -1) for e in events}
        assert by_type["turn.started"] == "odd host\\name:1:x"
        assert by_type["input.requested"] == "odd host\\name:1:x"
        assert by_type["input.answered"] == answering.holder
        assert by_type["turn.completed"] == answering.holder
