"""Reminders of an open question, posted in the Slack thread that asked it, against
the fake Slack Web API the other Slack tests use. The timers are fired with a chosen
``now`` (``runtime.timers.fire_due``), so no test waits for a period to pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from server_support import serve_app
from slack_support import FakeSlack
from test_slack import SESSION, Stage, staged

import turnkit
from turnkit import ToolContext, tool
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

pytest.importorskip("slack_sdk")
from starlette.applications import Starlette
from starlette.routing import Route

from turnkit.slack import slack_channel

HOUR = 3600.0


def asking_agent(name: str = "ops", **deadline: Any) -> turnkit.Agent:
    @tool
    async def refund(order: str, ctx: ToolContext) -> str:
        """Refunds once a person approves."""
        ok = await ctx.request_input(
            "approve", f"Refund order {order}?", schema={"type": "boolean"}, **deadline
        )
        return "refunded" if ok else "kept"

    def respond(messages: list[turnkit.Message]) -> ScriptedReply:
        last = messages[-1]
        if isinstance(last, turnkit.UserMessage):
            return ScriptedReply(tool_calls=[tool_call("refund", {"order": last.text[-2:]})])
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(text=f"Result: {last.result}")

    return turnkit.Agent(name=name, model=ScriptedModel(respond=respond), tools=[refund])


def decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def reminders(slack: FakeSlack) -> list[dict[str, Any]]:
    return [p for p in slack.of("chat.postMessage") if p["text"].startswith("Still waiting")]


async def ask(stage: Stage, event_id: str) -> turnkit.InputRequest:
    await stage.event("<@B1> refund 17", event_id=event_id, thread="100.1")
    await stage.settle(event_id, status="suspended")
    request = await stage.runtime.session("ops", SESSION).pending()
    assert request is not None and request.remind_at is not None
    return request


async def fire(runtime: turnkit.Runtime, at: float) -> int:
    return await runtime.timers.fire_due(runtime.store, now=at)  # type: ignore[arg-type]


async def test_a_reminder_is_posted_once_in_the_thread_that_asked(tmp_path: Path) -> None:
    agent = asking_agent(expires_in=3 * HOUR, on_expiry=False, remind_every=HOUR)
    async with staged(tmp_path, agent) as stage:
        request = await ask(stage, "Ev1")
        assert request.expires_at is not None and request.remind_at is not None
        assert not reminders(stage.slack)
        assert await fire(stage.runtime, request.remind_at + 1) == 1
        await eventually(lambda: len(reminders(stage.slack)) == 1, what="1 reminder(s)")
        (first,) = reminders(stage.slack)
        assert (first["channel"], first["thread_ts"]) == ("C1", "100.1")
        assert first["text"].startswith("Still waiting for an answer: Refund order 17?")
        blocks = decoded(first["blocks"])
        due = int(request.expires_at)
        assert blocks[-1]["elements"][0]["text"] == (
            f"Answer by <!date^{due}^{{date_short_pretty}} at {{time}}|{due}>"
        )
        # The same moment again gives nothing more; the next period gives reminder 2.
        assert await fire(stage.runtime, request.remind_at + 1) == 0
        assert await fire(stage.runtime, request.remind_at + HOUR + 1) == 1
        await eventually(lambda: len(reminders(stage.slack)) == 2, what="2 reminder(s)")
        second = reminders(stage.slack)[1]
        assert second["text"].startswith("Still waiting for an answer (reminder 2): Refund")
        # Reminders are the only thing posted: the question stays where it was asked.
        events = [e.type for e in await stage.runtime.session("ops", SESSION).events()]
        assert events.count("input.reminder") == 2 and "input.answered" not in events


async def test_a_question_without_deadline_is_reminded_without_one(tmp_path: Path) -> None:
    async with staged(tmp_path, asking_agent(remind_every=HOUR)) as stage:
        request = await ask(stage, "Ev2")
        assert request.remind_at is not None
        await fire(stage.runtime, request.remind_at + 1)
        await eventually(lambda: len(reminders(stage.slack)) == 1, what="1 reminder(s)")
        (posted,) = reminders(stage.slack)
        assert len(decoded(posted["blocks"])) == 1  # the question, no "Answer by"


async def test_sessions_slack_did_not_open_and_other_agents_get_no_slack_reminder(
    tmp_path: Path,
) -> None:
    other = asking_agent("other", remind_every=HOUR)
    async with staged(tmp_path, asking_agent(remind_every=HOUR), others=[other]) as stage:
        runtime = stage.runtime
        plain = runtime.session("ops", "web-1")  # opened over HTTP, say
        theirs = runtime.session("other", "slack:T1:C9:300.1")  # another Slack app's agent
        for session in (plain, theirs):
            result = await session.result(session.start("refund 18"))
            assert result.status == "suspended"
        request = await ask(stage, "Ev3")
        assert request.remind_at is not None
        assert await fire(runtime, request.remind_at + 1) == 3
        await eventually(lambda: len(reminders(stage.slack)) >= 1, what="1 reminder(s)")
        poster = stage.channel.post_reminders(runtime)  # the app's poster, now of any agent
        assert poster is stage.channel.post_reminders(runtime, agent="ops")
        assert [(p["channel"], p["thread_ts"]) for p in reminders(stage.slack)] == [("C1", "100.1")]
        # Widened to every agent, the other agent's Slack thread is reminded too (once).
        for session in (plain, theirs):
            assert sum(e.type == "input.reminder" for e in await session.events()) == 1
        await fire(runtime, request.remind_at + HOUR + 1)
        await eventually(lambda: len(reminders(stage.slack)) == 3, what="3 reminder(s)")
        assert sorted((p["channel"], p["thread_ts"]) for p in reminders(stage.slack)[1:]) == [
            ("C1", "100.1"),
            ("C9", "300.1"),
        ]


async def test_reminders_fired_in_a_worker_process_are_posted_from_there(
    tmp_path: Path,
) -> None:
    """The Slack routes in one runtime, the timers fired in another on the same store
    (a worker): the worker's ``post_reminders`` posts; the routes' process, which
    never hears the event, posts nothing, so the reminder is one message."""
    agent = asking_agent(remind_every=HOUR)
    async with staged(tmp_path, agent) as stage:
        request = await ask(stage, "Ev4")
        assert request.remind_at is not None
        fake = FakeSlack()
        api = Starlette(routes=[Route("/api/{method}", fake.handle, methods=["POST"])])
        async with (
            serve_app(api) as api_url,
            turnkit.Runtime([agent], store=SqliteStore(tmp_path / "s.db")) as worker,
        ):
            channel = slack_channel(
                signing_secret="s", bot_token="xoxb-worker", base_url=f"{api_url}/api/"
            )
            poster = channel.post_reminders(worker, agent="ops")
            assert await fire(worker, request.remind_at + 1) == 1
            await eventually(lambda: poster.posted == 1, what="one reminder posted")
            assert [(p["channel"], p["thread_ts"]) for p in reminders(fake)] == [("C1", "100.1")]
        assert not reminders(stage.slack)
