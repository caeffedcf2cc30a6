"""The Slack channel against a local stand-in for Slack: slack_sdk's real
``AsyncWebClient`` talks to a Web API server on 127.0.0.1 that records every call,
and inbound requests are signed with a test secret exactly as Slack signs them."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from eventually import eventually
from server_support import serve_app
from slack_support import SECRET, FakeSlack, mention, signed
from starlette.applications import Starlette
from starlette.routing import Route
from suite_paths import ROOT

import turnkit
from turnkit import ToolContext, tool
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

pytest.importorskip("slack_sdk")
from turnkit.slack import session_of, slack_channel

SLACK_CODE = Path(turnkit.slack.__file__).parent


def slack_at_work() -> bool:
    """Whether a task of this loop still runs work the Slack channel started in the
    background (a turn's rendering, a click's resume, a refusal posted): code of
    ``turnkit.slack`` at the bottom of a task the test did not make."""
    here = asyncio.current_task()
    return any(
        task is not here and not task.done() and _runs_slack_code(task.get_coro())
        for task in asyncio.all_tasks()
    )


def _runs_slack_code(coro: object) -> bool:
    code = getattr(coro, "cr_code", None)
    return code is not None and Path(code.co_filename).is_relative_to(SLACK_CODE)


#: How long the Slack channel's background work may take: a long answer is drawn in
#: hundreds of edits, each a request to the fake Slack, slow on a loaded machine.
RENDERING = 120.0


async def slack_done() -> None:
    """Wait until the Slack channel's background work has ended: what it was going to
    send Slack is sent, and what it was going to store is stored."""
    await eventually(
        lambda: not slack_at_work(),
        what="the Slack channel's background work ended",
        timeout=RENDERING,
    )


def ops_agent(gate: asyncio.Event | None = None) -> turnkit.Agent:
    @tool
    async def lookup(order: str) -> str:
        """Finds an order."""
        if gate is not None:
            await gate.wait()
        if order == "bad":
            raise ValueError("no such order")
        return f"order {order} is packed"

    @tool
    async def refund(order: str, ctx: ToolContext) -> str:
        """Refunds once the person who asked approves."""
        ok = await ctx.request_input(
            "approve", f"Refund order {order}?", schema={"type": "boolean"}
        )
        return "refunded" if ok else "kept"

    @tool
    async def count(what: str, ctx: ToolContext) -> str:
        """Asks how many."""
        n = await ctx.request_input(
            "amount", f"How many {what}?", schema={"type": "integer", "minimum": 1}
        )
        return f"counted {n}"

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage | turnkit.TriggerMessage):
            words = last.text.split()
            if "many" in words:
                return ScriptedReply(tool_calls=[tool_call("count", {"what": words[-1]})])
            if "refunds" in words:  # two orders: two questions at once
                orders = words[-2:]
                return ScriptedReply(tool_calls=[tool_call("refund", {"order": o}) for o in orders])
            if "refund" in words:
                return ScriptedReply(tool_calls=[tool_call("refund", {"order": words[-1]})])
            return ScriptedReply(tool_calls=[tool_call("lookup", {"order": words[-1]})])
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(text=f"Result: {last.result}", chunks=3)

    return turnkit.Agent(
        name="ops",
        model=ScriptedModel(respond=respond),
        instructions=".",
        tools=[lookup, refund, count],
    )


@dataclass
class Stage:
    runtime: turnkit.Runtime
    slack: FakeSlack
    client: httpx.AsyncClient
    channel: Any
    ctx: turnkit.ChannelContext
    #: The message ts each event id was sent with (a retry sends the same message).
    sent: dict[str, str] = field(default_factory=dict)
    #: The Slack channel each event id was sent in.
    where: dict[str, str] = field(default_factory=dict)

    def turn(self, event_id: str) -> str:
        return f"slack-{self.where.get(event_id, 'C1')}-{self.sent[event_id]}"

    async def event(
        self,
        text: str,
        *,
        event_id: str,
        user: str = "U1",
        thread: str | None = None,
        retry: int | None = None,
        kind: str = "app_mention",
        ts: str | None = None,
        channel: str = "C1",
        **extra: Any,
    ) -> httpx.Response:
        ts = ts or self.sent.get(event_id) or f"{time.time():.6f}"
        self.sent[event_id] = ts
        self.where[event_id] = channel
        event = {
            "type": kind,
            "user": user,
            "text": text,
            "channel": channel,
            "ts": ts,
            **extra,
        }
        if thread is not None:
            event["thread_ts"] = thread
        body = json.dumps(
            {"type": "event_callback", "team_id": "T1", "event_id": event_id, "event": event}
        ).encode()
        headers = {**signed(body), "Content-Type": "application/json"}
        if retry is not None:
            headers["X-Slack-Retry-Num"] = str(retry)
        return await self.client.post("/slack/events", content=body, headers=headers)

    async def submit(self, view: dict[str, Any], text: str, *, user: str) -> httpx.Response:
        values = {"turnkit_answer_block": {"answer": {"type": "plain_text_input", "value": text}}}
        payload = {
            "type": "view_submission",
            "user": {"id": user},
            "team": {"id": "T1"},
            "view": {**view, "state": {"values": values}},
        }
        body = urlencode({"payload": json.dumps(payload)}).encode()
        headers = {**signed(body), "Content-Type": "application/x-www-form-urlencoded"}
        return await self.client.post("/slack/interactivity", content=body, headers=headers)

    async def click(self, button: dict[str, Any], *, user: str, thread: str) -> httpx.Response:
        payload = {
            "trigger_id": "trigger-1",
            "type": "block_actions",
            "user": {"id": user},
            "channel": {"id": "C1"},
            "message": {"ts": "9.9", "thread_ts": thread},
            "actions": [{"action_id": button["action_id"], "value": button["value"]}],
        }
        body = urlencode({"payload": json.dumps(payload)}).encode()
        headers = {**signed(body), "Content-Type": "application/x-www-form-urlencoded"}
        return await self.client.post("/slack/interactivity", content=body, headers=headers)

    async def settle(
        self, event_id: str, *, status: str = "completed", session_id: str | None = None
    ) -> None:
        """Wait until the turn of ``event_id`` reached ``status`` and its reply was drawn."""
        session = self.runtime.session("ops", session_id or SESSION)
        turn_id = self.turn(event_id)

        async def reached() -> bool:
            record = await session.turn_record(turn_id)
            done = record is not None and record.status == status
            return done and (status == "suspended" or not session.delivering(turn_id))

        await eventually(reached, what=f"turn {turn_id} {status}")
        await slack_done()  # the renderer's last calls


@asynccontextmanager
async def staged(
    tmp_path: Path, agent: turnkit.Agent, others: Sequence[turnkit.Agent] = (), **options: Any
) -> AsyncIterator[Stage]:
    fake = FakeSlack()
    api = Starlette(routes=[Route("/api/{method}", fake.handle, methods=["POST"])])
    async with serve_app(api) as api_url:
        channel = slack_channel(
            signing_secret=SECRET,
            bot_token="xoxb-test",
            base_url=f"{api_url}/api/",
            update_interval=0.0,
            **options,
        )
        store = SqliteStore(tmp_path / "s.db")
        async with turnkit.Runtime([agent, *others], store=store) as runtime:
            ctx = turnkit.mount_agent(agent, runtime, channels=[channel])
            app = Starlette()
            app.mount("/slack", channel.app(ctx))
            async with (
                serve_app(app) as url,
                httpx.AsyncClient(base_url=url, timeout=30) as client,
            ):
                yield Stage(runtime=runtime, slack=fake, client=client, channel=channel, ctx=ctx)


SESSION = "slack:T1:C1:100.1"


async def requested(session: turnkit.AgentSession) -> bool:
    """Whether a turn of ``session`` has asked for a tool call."""
    return any(e.type == "action.requested" for e in await session.events())


async def test_a_mention_streams_a_reply_with_its_tool_timeline(tmp_path: Path) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        reply = await stage.event("<@B1> where is 17", event_id="Ev1", thread="100.1")
        assert reply.status_code == 200 and reply.content == b""
        await stage.settle("Ev1")
        failed = await stage.event("<@B1> look up bad", event_id="Ev2", thread="100.1")
        assert failed.status_code == 200
        await stage.settle("Ev2")
        infos = await stage.runtime.sessions()
    posts = stage.slack.of("chat.postMessage")
    assert [p["thread_ts"] for p in posts] == [
        "100.1",
        "100.1",
    ]  # one reply per turn, in the thread
    updates = stage.slack.of("chat.update")
    first = [u["text"] for u in updates if u["ts"] == stage.slack.posted[0]]
    assert first[-1] == "✓ `lookup`\nResult: order 17 is packed"
    assert len(first) >= 3  # the timeline, then the text as it streamed
    second = [u["text"] for u in updates if u["ts"] == stage.slack.posted[1]]
    assert second[-1].startswith("✗ `lookup` failed: ")
    assert "no such order" in second[-1]
    assert [(i.session_id, i.owner) for i in infos] == [(SESSION, None)]


async def test_requests_not_signed_by_slack_get_401_and_start_nothing(tmp_path: Path) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        body = json.dumps(
            {
                "type": "event_callback",
                "team_id": "T1",
                "event_id": "Ev9",
                "event": {
                    "type": "app_mention",
                    "user": "U1",
                    "text": "hi 1",
                    "channel": "C1",
                    "ts": "1.1",
                },
            }
        ).encode()
        json_type = {"Content-Type": "application/json"}
        cases = [
            {**signed(body, secret="wrong"), **json_type},  # forged
            {**signed(body, at=int(time.time()) - 400), **json_type},  # stale
            json_type,  # unsigned
            {**signed(b"{}"), **json_type},  # a signature of another body
        ]
        for headers in cases:
            reply = await stage.client.post("/slack/events", content=body, headers=headers)
            assert reply.status_code == 401, headers
        stale = signed(body, at=int(time.time()) - 400)
        click = await stage.client.post("/slack/interactivity", content=body, headers=stale)
        assert click.status_code == 401
        await slack_done()
        assert await stage.runtime.sessions() == [] and stage.slack.calls == []


async def test_url_verification_answers_the_challenge(tmp_path: Path) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        body = json.dumps({"type": "url_verification", "challenge": "abc123"}).encode()
        reply = await stage.client.post(
            "/slack/events",
            content=body,
            headers={**signed(body), "Content-Type": "application/json"},
        )
        assert reply.json() == {"challenge": "abc123"}


async def test_slack_retrying_an_event_runs_one_turn(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with staged(tmp_path, ops_agent(gate)) as stage:
        first = await stage.event("<@B1> where is 5", event_id="EvR", thread="100.1")
        retries = [
            await stage.event("<@B1> where is 5", event_id="EvR", thread="100.1", retry=n)
            for n in (1, 2)
        ]
        assert first.status_code == 200 and all(r.status_code == 200 for r in retries)
        gate.set()
        await stage.settle("EvR")
        again = await stage.event("<@B1> where is 5", event_id="EvR", thread="100.1", retry=3)
        assert again.status_code == 200
        await slack_done()
        messages = await stage.runtime.session("ops", SESSION).messages()
    assert len(stage.slack.of("chat.postMessage")) == 1
    assert messages[0].text == "where is 5"  # the mention of the bot is not the question
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]


async def test_bot_messages_edits_and_plain_channel_messages_are_ignored(tmp_path: Path) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        await stage.event("from a bot 1", event_id="Eb1", thread="100.1", bot_id="B1")
        await stage.event("edited 1", event_id="Eb2", thread="100.1", subtype="message_changed")
        await slack_done()
        assert await stage.runtime.sessions() == [] and stage.slack.calls == []


async def test_an_approval_clicked_by_the_asker_completes_and_by_another_is_refused(
    tmp_path: Path,
) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        await stage.event("<@B1> refund 42", event_id="Ea1", user="U1", thread="100.1")
        await stage.settle("Ea1", status="suspended")
        (question,) = [p for p in stage.slack.of("chat.postMessage") if p.get("blocks")]
        assert question["thread_ts"] == "100.1" and question["text"] == "Refund order 42?"
        blocks = question["blocks"]
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        approve, deny = blocks[1]["elements"]
        session = stage.runtime.session("ops", SESSION)
        before = (await session.messages(), await session.events())
        refused = await stage.click(approve, user="U2", thread="100.1")
        assert refused.status_code == 200
        await eventually(lambda: stage.slack.of("chat.postEphemeral"), what="an ephemeral refusal")
        (ephemeral,) = stage.slack.of("chat.postEphemeral")
        assert ephemeral["user"] == "U2" and "may not answer" in ephemeral["text"]
        # Issue 28 item 12: in the thread, where the clicker (on mobile too) sees it.
        assert ephemeral["thread_ts"] == "100.1"
        assert (await session.messages(), await session.events()) == before
        await stage.click(approve, user="U1", thread="100.1")
        await stage.settle("Ea1")
        late = await stage.click(deny, user="U1", thread="100.1")
        assert late.status_code == 200
        await eventually(
            lambda: len(stage.slack.of("chat.postEphemeral")) == 2, what="a second ephemeral"
        )
        assert "already answered" in stage.slack.of("chat.postEphemeral")[1]["text"]
        assert stage.slack.of("chat.postEphemeral")[1]["thread_ts"] == "100.1"
        events = await session.events()
    answered = [e for e in events if e.type == "input.answered"]
    assert [(e.by, e.value) for e in answered] == [("U1", True)]
    assert events[-1].type == "turn.completed"
    assert stage.slack.of("chat.update")[-1]["text"].endswith("Result: refunded")
    # Issue 28 item 13: the question itself now says who answered, and has no buttons.
    (edited,) = [u for u in stage.slack.of("chat.update") if u["ts"] == "9.9"]
    assert edited["text"] == "Approved by <@U1>"
    shown = json.loads(edited["blocks"]) if isinstance(edited["blocks"], str) else edited["blocks"]
    assert [b["type"] for b in shown] == ["context"]
    assert "<!date^" in shown[0]["elements"][0]["text"]


async def test_two_questions_at_once_get_a_message_each_and_are_answered_one_by_one(
    tmp_path: Path,
) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        await stage.event("<@B1> refunds 41 42", event_id="Eb1", user="U1", thread="100.1")
        await stage.settle("Eb1", status="suspended")

        def questions() -> list[dict[str, Any]]:
            return [p for p in stage.slack.of("chat.postMessage") if p.get("blocks")]

        assert [q["text"] for q in questions()] == ["Refund order 41?", "Refund order 42?"]
        buttons = []
        for question in questions():
            blocks = question["blocks"]
            buttons.append((json.loads(blocks) if isinstance(blocks, str) else blocks)[1])
        (approve41, deny41), (approve42, _) = (b["elements"] for b in buttons)
        session = stage.runtime.session("ops", SESSION)
        await stage.click(approve42, user="U1", thread="100.1")

        async def answered_once() -> bool:
            return sum(e.type == "input.answered" for e in await session.events()) == 1

        await eventually(lambda: answered_once(), what="the answer to order 42 stored")
        assert (await session.turn_record(stage.turn("Eb1"))).status == "suspended"  # type: ignore[union-attr]
        await slack_done()
        assert len(questions()) == 2  # the open one is not posted again
        await stage.click(deny41, user="U1", thread="100.1")
        await stage.settle("Eb1")
        events = await session.events()
    assert [(e.value, e.by) for e in events if e.type == "input.answered"] == [  # type: ignore[attr-defined]
        (True, "U1"),
        (False, "U1"),
    ]
    assert stage.slack.of("chat.update")[-1]["text"].endswith("Result: refunded")
    assert approve41 != approve42


async def test_replace_in_flight_supersedes_the_first_reply(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with staged(tmp_path, ops_agent(gate), replace_in_flight=True) as stage:
        await stage.event("<@B1> where is 1", event_id="Ep1", thread="100.1")
        session = stage.runtime.session("ops", SESSION)
        await eventually(lambda: requested(session), what="the first turn's tool call")
        await stage.event("<@B1> where is 2", event_id="Ep2", thread="100.1")
        gate.set()
        await stage.settle("Ep2")
    updates = stage.slack.of("chat.update")
    first = [u["text"] for u in updates if u["ts"] == stage.slack.posted[0]]
    second = [u["text"] for u in updates if u["ts"] == stage.slack.posted[1]]
    assert first[-1].endswith("_superseded by a newer message_")
    assert second[-1].endswith("Result: order 2 is packed")


async def test_a_rate_limited_update_is_sent_again_after_retry_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="turnkit")
    async with staged(tmp_path, ops_agent()) as stage:
        seen: list[turnkit.TurnEvent] = []
        stage.runtime.sink.subscribe(seen.append)
        stage.slack.rate_limited = 1
        await stage.event("<@B1> where is 3", event_id="Eq1", thread="100.1")
        await stage.settle("Eq1")
        await eventually(
            lambda: bool(
                stage.slack.of("chat.update")[-1:]
                and stage.slack.of("chat.update")[-1]["text"].endswith("order 3 is packed")
            ),
            what="the refused update sent again",
        )
    updates = stage.slack.of("chat.update")
    assert updates[0] == updates[1]  # the refused one, sent again
    assert updates[-1]["text"].endswith("Result: order 3 is packed")
    # Slack said when to retry, the retry was taken: nothing failed, nothing to report.
    assert "delivery.failed" not in [e.type for e in seen] and "turn.completed" in [
        e.type for e in seen
    ]
    assert [r for r in caplog.records if r.name.startswith("turnkit")] == []


def test_one_session_per_thread() -> None:
    payload = {"team_id": "T9", "event": {"channel": "C2", "ts": "5.5", "thread_ts": "1.1"}}
    assert session_of(payload) == "slack:T9:C2:1.1"
    top = {"team_id": "T9", "event": {"channel": "C2", "ts": "5.5"}}
    assert session_of(top) == "slack:T9:C2:5.5"


async def test_a_proactive_turn_posts_into_a_channel(tmp_path: Path) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        result = await turnkit.receive(
            stage.channel,
            stage.ctx,
            seed="nightly check of 8",
            target={"channel_id": "C9"},
            trigger=turnkit.Proactive(by="cron:nightly"),
            session="slack:T1:C9:nightly",
        )
    assert result.status == "completed"
    (post,) = stage.slack.of("chat.postMessage")
    assert post["channel"] == "C9" and post.get("thread_ts") is None
    assert stage.slack.of("chat.update")[-1]["text"].endswith("Result: order 8 is packed")


async def test_a_proactive_reply_slack_refuses_raises_and_surfaces(tmp_path: Path) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        seen: list[turnkit.TurnEvent] = []
        stage.runtime.sink.subscribe(seen.append)
        stage.slack.post_error = "channel_not_found"
        with pytest.raises(turnkit.DeliveryError, match="channel_not_found") as raised:
            await turnkit.receive(
                stage.channel,
                stage.ctx,
                seed="nightly check of 8",
                target={"channel_id": "C404"},
                trigger=turnkit.Proactive(by="cron:nightly"),
                session="slack:T1:C404:nightly",
            )
        session = stage.runtime.session("ops", "slack:T1:C404:nightly")
        result = await session.result(seen[0].turn_id)  # the turn runs to its end
    assert result.status == "completed" and result.text == "Result: order 8 is packed"
    assert (raised.value.method, raised.value.code) == ("chat.postMessage", "channel_not_found")
    (failed,) = [e for e in seen if isinstance(e, turnkit.DeliveryFailedEvent)]
    assert (failed.method, failed.error) == ("chat.postMessage", "channel_not_found")
    assert failed.target == repr({"channel_id": "C404"})


async def test_authorize_decides_who_may_start_turns_and_answer_nameless_questions(
    tmp_path: Path,
) -> None:
    from turnkit.server import Principal, SessionAccess

    seen: list[tuple[str, SessionAccess, dict[str, str]]] = []

    def ops_only(principal: Principal, access: SessionAccess) -> bool:
        seen.append((principal.id, access, dict(principal.claims)))
        return principal.id != "U3" and principal.claims["team"] == "T1"

    async with staged(tmp_path, ops_agent(), authorize=ops_only) as stage:
        await stage.event("<@B1> where is 4", event_id="Ez1", user="U3", thread="100.1")
        await eventually(lambda: stage.slack.of("chat.postEphemeral"), what="an ephemeral refusal")
        (refusal,) = stage.slack.of("chat.postEphemeral")
        assert refusal["user"] == "U3" and "may not use" in refusal["text"]
        assert await stage.runtime.sessions() == []  # nothing started, nothing stored
        assert stage.slack.of("chat.postMessage") == []
        await stage.event("<@B1> where is 4", event_id="Ez2", user="U1", thread="100.1")
        await stage.settle("Ez2")
    principal, access, claims = seen[-1]
    assert principal == "U1" and claims == {"team": "T1", "channel": "C1"}
    assert access.action == "turn" and access.session_id == SESSION and not access.exists
    assert stage.slack.of("chat.update")[-1]["text"].endswith("Result: order 4 is packed")


async def test_the_slack_example_serves_the_ops_agent_next_to_its_page(tmp_path: Path) -> None:
    import importlib.util

    path = ROOT / "examples" / "slack" / "app.py"
    spec = importlib.util.spec_from_file_location("slack_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    fake = FakeSlack()
    api = Starlette(routes=[Route("/api/{method}", fake.handle, methods=["POST"])])
    async with serve_app(api) as api_url:
        runtime, public, page = example.build(
            str(tmp_path / "e.db"),
            signing_secret=SECRET,
            bot_token="xoxb-test",
            base_url=f"{api_url}/api/",
        )
        async with (
            runtime,
            serve_app(public) as public_url,
            serve_app(page) as page_url,
            httpx.AsyncClient(timeout=30) as client,
        ):
            body = mention("order 2 blue widgets", event_id="Ex1")
            headers = {**signed(body), "Content-Type": "application/json"}
            reply = await client.post(f"{public_url}/slack/events", content=body, headers=headers)
            assert reply.status_code == 200
            done = "Done: order #1 (2 x blue widgets) is packed."
            await eventually(
                lambda: any(u["text"].endswith(done) for u in fake.of("chat.update")),
                what="the reply drawn in Slack",
            )
            assert (await client.get(f"{page_url}/")).status_code == 200
            tunnelled = await client.get(f"{page_url}/", headers={"Host": "abc.tunnel.example"})
            assert tunnelled.status_code == 421  # the page never answers a public name
            await slack_done()


async def test_a_question_that_is_not_yes_or_no_is_answered_in_a_form(tmp_path: Path) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        await stage.event("<@B1> how many boxes", event_id="Em1", user="U1", thread="100.1")
        await stage.settle("Em1", status="suspended")
        (question,) = [p for p in stage.slack.of("chat.postMessage") if p.get("blocks")]
        blocks = question["blocks"]
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        (button,) = blocks[1]["elements"]
        assert button["action_id"] == "turnkit_answer_open"
        await stage.click(button, user="U1", thread="100.1")
        await eventually(lambda: stage.slack.of("views.open"), what="a form opened")
        (opened,) = stage.slack.of("views.open")
        view = opened["view"]
        if isinstance(view, str):
            view = json.loads(view)
        assert opened["trigger_id"] == "trigger-1" and view["callback_id"] == "turnkit_answer"
        session = stage.runtime.session("ops", SESSION)
        before = (await session.messages(), await session.events())
        for text, user, wanted in [
            ("many", "U1", "integer"),
            ("0", "U1", "minimum"),
            ("12", "U2", "may not answer"),
        ]:
            refused = await stage.submit(view, text, user=user)
            assert refused.status_code == 200
            errors = refused.json()
            assert errors["response_action"] == "errors", errors
            assert wanted in errors["errors"]["turnkit_answer_block"], errors
            assert (await session.messages(), await session.events()) == before
        taken = await stage.submit(view, "12", user="U1")
        assert taken.status_code == 200 and taken.content == b""
        await stage.settle("Em1")
        again = await stage.submit(view, "13", user="U1")
        assert "already answered" in again.json()["errors"]["turnkit_answer_block"]
        answered = [e for e in await session.events() if e.type == "input.answered"]
    assert [(e.by, e.value) for e in answered] == [("U1", 12)]
    assert stage.slack.of("chat.update")[-1]["text"].endswith("Result: counted 12")


@pytest.mark.parametrize(
    ("method", "code"),
    [
        ("chat.postMessage", "channel_not_found"),
        ("chat.update", "token_revoked"),
        ("chat.update", "invalid_auth"),
    ],
)
async def test_a_slack_error_surfaces_as_an_event_and_a_log_and_the_turn_still_completes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, method: str, code: str
) -> None:
    caplog.set_level("ERROR", logger="turnkit")
    async with staged(tmp_path, ops_agent()) as stage:
        seen: list[turnkit.TurnEvent] = []
        stage.runtime.sink.subscribe(seen.append)
        if method == "chat.postMessage":
            stage.slack.post_error = code
        else:
            stage.slack.update_error = code
        await stage.event("<@B1> where is 6", event_id="Ef1", thread="100.1")
        await stage.settle("Ef1")
        await eventually(
            lambda: any(e.type == "delivery.failed" for e in seen), what="delivery.failed"
        )
        turn_id = stage.turn("Ef1")
        session = stage.runtime.session("ops", SESSION)
        record = await session.turn_record(turn_id)
        logged_events = await session.events()
    assert record is not None and record.status == "completed"
    assert record.text == "Result: order 6 is packed"
    (failed,) = [e for e in seen if isinstance(e, turnkit.DeliveryFailedEvent)]
    assert (failed.turn_id, failed.session_id) == (turn_id, SESSION)
    assert (failed.channel, failed.target, failed.method, failed.error) == (
        "slack",
        "C1",
        method,
        code,
    )
    assert failed.seq is None  # live only: the session's log is the turn's own story
    assert "delivery.failed" not in [e.type for e in logged_events]
    assert logged_events[-1].type == "turn.completed"
    # The reply stopped at the first refusal: nothing was sent after it.
    assert [m for m, _ in stage.slack.calls].count(method) == 1
    (logged,) = [r for r in caplog.records if r.levelname == "ERROR"]
    text = logged.getMessage()
    assert f"turn {turn_id}" in text and code in text and method in text and "C1" in text
    assert "xoxb" not in text


async def test_thread_messages_are_for_the_bot_only_in_its_threads_and_count_once(
    tmp_path: Path,
) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        # A reply in a thread the bot never spoke in: Slack sends it, nothing starts.
        await stage.event("where is 1", event_id="Et0", kind="message", thread="555.5")
        await slack_done()
        assert await stage.runtime.sessions() == [] and stage.slack.calls == []
        # A mention in a thread arrives twice: as app_mention and as message.
        await stage.event("<@B1> where is 2", event_id="Et1", thread="100.1", ts="200.2")
        await stage.event(
            "<@B1> where is 2", event_id="Et2", kind="message", thread="100.1", ts="200.2"
        )
        await stage.settle("Et1")
        # Once the bot talks in the thread, a plain reply there is for it.
        await stage.event("where is 3", event_id="Et3", kind="message", thread="100.1")
        await stage.settle("Et3")
        messages = await stage.runtime.session("ops", SESSION).messages()
    assert [m.text for m in messages if m.role == "user"] == ["where is 2", "where is 3"]
    assert len(stage.slack.of("chat.postMessage")) == 2


class FakeClock:
    """The pacer's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Script:
    """A turn's events handed to a reply one at a time: ``give`` returns once the
    reply has done everything the event made it do (it asked for the next one)."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self._next: asyncio.Queue[turnkit.TurnEvent | None] = asyncio.Queue()
        self._handled = asyncio.Event()

    async def events(self) -> AsyncIterator[turnkit.TurnEvent]:
        while (event := await self._next.get()) is not None:
            yield event
            self._handled.set()

    async def delta(self, text: str) -> None:
        self._handled.clear()
        self._next.put_nowait(
            turnkit.MessageDeltaEvent(turn_id=self.turn_id, session_id="s", text=text)
        )
        await self._handled.wait()

    def end(self) -> None:
        self._next.put_nowait(None)


async def test_streamed_edits_are_paced_per_slack_channel_across_its_replies() -> None:
    """Two replies streaming into one channel share its one-edit-a-second pace; a
    reply in another channel keeps its own. Time is the pacer's clock, moved by the
    script: a quarter second per round of deltas."""
    from slack_sdk.web.async_client import AsyncWebClient

    from turnkit.slack import EditPacer, SlackChannel, SlackThread

    fake = FakeSlack()
    api = Starlette(routes=[Route("/api/{method}", fake.handle, methods=["POST"])])
    clock = FakeClock()
    async with serve_app(api) as api_url:
        channel = SlackChannel(
            signing_secret=SECRET,
            client=AsyncWebClient(token="xoxb-test", base_url=f"{api_url}/api/"),
            pacer=EditPacer(1.0, clock=clock),
        )
        a, b, c = Script("a"), Script("b"), Script("c")
        where = {a: SlackThread(channel="C1", thread_ts="1.1"), b: SlackThread(channel="C1")}
        where[c] = SlackThread(channel="C2", thread_ts="2.2")
        replies = [asyncio.create_task(channel.deliver(where[s], s.events())) for s in (a, b, c)]
        for script in (a, b, c):
            await script.delta(script.turn_id)  # each posts its placeholder at 0.0
        for step in range(1, 17):
            clock.now = step * 0.25
            # Who speaks first in C1 changes every second, as it would by chance.
            first, second = (b, a) if (step // 4) % 2 else (a, b)
            for script in (first, second, c):
                await script.delta(script.turn_id)
        for script in (a, b, c):
            script.end()
        await asyncio.gather(*replies)
    posted = dict(zip("abc", fake.posted, strict=True))
    updates = [(u["channel"], u["ts"], u["text"]) for u in fake.of("chat.update")]
    # In C1 one streamed edit a second in all, whichever reply had the next delta
    # (at steps 4, 8, 12, 16); then each reply's last edit, if it still had news.
    assert [u for u in updates if u[0] == "C1"] == [
        ("C1", posted["b"], "b" * 5),
        ("C1", posted["a"], "a" * 9),
        ("C1", posted["b"], "b" * 13),
        ("C1", posted["a"], "a" * 17),
        ("C1", posted["b"], "b" * 17),  # b's end: it goes whatever the pace
    ]
    # C2's reply was never held back by C1's.
    assert [u for u in updates if u[0] == "C2"] == [
        ("C2", posted["c"], "c" * n) for n in (5, 9, 13, 17)
    ]


def test_an_edit_pacer_refuses_a_negative_interval() -> None:
    from turnkit.slack import EditPacer

    with pytest.raises(turnkit.ConfigurationError, match="interval must be seconds >= 0"):
        EditPacer(-1)


async def test_direct_messages_start_a_session_per_thread_and_continue_it(
    tmp_path: Path,
) -> None:
    dm = {"kind": "message", "channel": "D1", "channel_type": "im"}
    async with staged(tmp_path, ops_agent()) as stage:
        # A direct message needs no mention: it starts a thread, and a session.
        await stage.event("where is 11", event_id="Ed1", ts="300.1", **dm)
        first = "slack:T1:D1:300.1"
        await stage.settle("Ed1", session_id=first)
        # A reply in that thread goes on in the same session.
        await stage.event("where is 12", event_id="Ed2", thread="300.1", **dm)
        await stage.settle("Ed2", session_id=first)
        # Another message at the top of the conversation starts another.
        await stage.event("where is 13", event_id="Ed3", ts="400.1", **dm)
        second = "slack:T1:D1:400.1"
        await stage.settle("Ed3", session_id=second)
        # A reply under a message of the person's that the bot never answered is
        # still for the bot: in a direct conversation, everything is.
        await stage.event("where is 14", event_id="Ed4", thread="500.1", **dm)
        third = "slack:T1:D1:500.1"
        await stage.settle("Ed4", session_id=third)
        # Its own messages there are not.
        await stage.event("from the bot 15", event_id="Ed5", bot_id="B1", **dm)
        await slack_done()
        sessions = sorted(i.session_id for i in await stage.runtime.sessions())
        asked = {
            s: [
                m.text for m in await stage.runtime.session("ops", s).messages() if m.role == "user"
            ]
            for s in sessions
        }
    assert asked == {
        first: ["where is 11", "where is 12"],
        second: ["where is 13"],
        third: ["where is 14"],
    }
    posts = stage.slack.of("chat.postMessage")
    assert [(p["channel"], p["thread_ts"]) for p in posts] == [
        ("D1", "300.1"),
        ("D1", "300.1"),
        ("D1", "400.1"),
        ("D1", "500.1"),
    ]
    assert stage.slack.of("chat.update")[-1]["text"].endswith("Result: order 14 is packed")


async def test_a_group_conversation_is_a_channel_not_a_direct_message(tmp_path: Path) -> None:
    async with staged(tmp_path, ops_agent()) as stage:
        await stage.event(
            "where is 21", event_id="Eg1", kind="message", channel="G1", channel_type="mpim"
        )
        await slack_done()
        assert await stage.runtime.sessions() == [] and stage.slack.calls == []


async def test_item5_odd_signature_headers_and_bodies_are_401_in_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27 item 5: slack_sdk's verifier runs int(timestamp) and decodes the
    body, so these gave a 500 and a traceback; each is a 401 and one warning line."""
    good = json.dumps({"type": "url_verification", "challenge": "c"}).encode()
    now = str(int(time.time()))
    cases: list[tuple[bytes, dict[str, Any]]] = [
        (good, {**signed(good), "X-Slack-Request-Timestamp": "soon"}),
        (good, {**signed(good), "X-Slack-Request-Timestamp": "9" * 5000}),
        (good, {"X-Slack-Request-Timestamp": now, "X-Slack-Signature": "v0=é".encode()}),
        (good, {"X-Slack-Request-Timestamp": "", "X-Slack-Signature": ""}),
        (good, {"X-Slack-Request-Timestamp": now}),
        (b"\xff\xfe{}", signed(b"\xff\xfe{}")),
    ]
    async with staged(tmp_path, ops_agent()) as stage:
        for path in ("/slack/events", "/slack/interactivity"):
            for n, (body, headers) in enumerate(cases):
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="turnkit.slack"):
                    reply = await stage.client.post(path, content=body, headers=headers)
                assert reply.status_code == 401, (path, n, reply.text)
                refusals = [r for r in caplog.records if r.name == "turnkit.slack"]
                assert len(refusals) == 1 and refusals[0].exc_info is None, (path, n)
                assert "\n" not in refusals[0].getMessage()
        assert await stage.runtime.sessions() == []


async def test_item6_signed_but_malformed_payloads_are_400_with_nothing_stored(
    tmp_path: Path,
) -> None:
    """Issue 27 item 6: the shape of what is read is checked first (a list-valued
    channel once became session ``slack::['C1']:9.2``)."""

    async def post_event(event: Any) -> httpx.Response:
        body = json.dumps({"type": "event_callback", "team_id": "T1", "event": event}).encode()
        return await stage.client.post("/slack/events", content=body, headers=signed(body))

    async def post_form(payload: str) -> httpx.Response:
        body = urlencode({"payload": payload}).encode()
        headers = {**signed(body), "Content-Type": "application/x-www-form-urlencoded"}
        return await stage.client.post("/slack/interactivity", content=body, headers=headers)

    mention = {"type": "app_mention", "user": "U1", "text": "<@B1> hi", "ts": "9.2"}
    async with staged(tmp_path, ops_agent()) as stage:
        for event in (
            mention,  # no channel
            {**mention, "channel": ["C1"]},
            {**mention, "channel": "C1", "ts": 9.2},
            {**mention, "channel": "C1", "text": {"deep": [[[[1]]]]}},
        ):
            reply = await post_event(event)
            assert reply.status_code == 400, (event, reply.text)
            assert "the payload is not one Slack sends" in reply.json()["error"]
        deep = b'{"type": "event_callback", "event": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
        reply = await stage.client.post("/slack/events", content=deep, headers=signed(deep))
        assert reply.status_code == 400
        for payload in (
            "[]",
            "{}",
            json.dumps({"type": "block_actions", "user": {"id": "U1"}, "actions": []}),
            json.dumps(
                {
                    "type": "block_actions",
                    "user": {"id": "U1"},
                    "channel": {"id": "C1"},
                    "actions": [{"action_id": "turnkit_approve", "value": "[]"}],
                }
            ),
            "[" * 10_000 + "]" * 10_000,
        ):
            reply = await post_form(payload)
            assert reply.status_code == 400, (payload[:80], reply.text)
        # A well-formed event of a type turnkit does not handle is acknowledged.
        assert (await post_event({"type": "reaction_added", "user": "U1"})).status_code == 200
        assert await stage.runtime.sessions() == []
        assert stage.slack.calls == []


async def test_item11_an_answer_longer_than_one_message_goes_on_in_the_next(
    tmp_path: Path,
) -> None:
    """Issue 28 item 11: a 100,000-character answer was cut at 3,900 with "…"; now
    it spans messages of the thread (Slack takes 40,000 in one), none dropped."""
    from turnkit.slack._render import MAX_TEXT, pages_of

    lines = [f"line {n:05d} " + "x" * 90 for n in range(1000)]
    answer = "\n".join(lines)
    agent = turnkit.Agent(name="ops", model=ScriptedModel([answer]), instructions=".")
    async with staged(tmp_path, agent) as stage:
        reply = await stage.event("<@B1> tell me everything", event_id="EvL", thread="100.1")
        assert reply.status_code == 200
        await stage.settle("EvL")
    posts = stage.slack.of("chat.postMessage")
    assert len(posts) == len(pages_of(answer)) >= 3
    assert all(p["thread_ts"] == "100.1" for p in posts)
    final = [_final_text(stage, ts) for ts in stage.slack.posted]
    assert all(len(page) <= MAX_TEXT for page in final)
    assert "\n".join(final) == answer  # every line, in order, none twice


def _final_text(stage: Any, ts: str) -> str:
    """The last text a message of the reply showed (its post, or its last edit)."""
    position = stage.slack.posted.index(ts)
    posts = [a for m, a in stage.slack.calls if m == "chat.postMessage"]
    text = posts[position]["text"]
    for method, args in stage.slack.calls:
        if method == "chat.update" and args["ts"] == ts:
            text = args["text"]
    return text


async def test_item10_a_turn_replaced_before_it_ran_posts_no_notice(tmp_path: Path) -> None:
    """Issue 28 item 10: two messages arrive while a turn runs; the middle turn
    never runs, and used to post its own "superseded" notice, sometimes below the
    newest reply. It posts nothing; the thread ends with the newest reply."""
    gate = asyncio.Event()
    async with staged(tmp_path, ops_agent(gate), replace_in_flight=True) as stage:
        await stage.event("<@B1> where is 1", event_id="Er1", thread="100.1")
        session = stage.runtime.session("ops", SESSION)
        await eventually(lambda: requested(session), what="the first turn's tool call")
        await stage.event("<@B1> where is 2", event_id="Er2", thread="100.1")
        await stage.event("<@B1> where is 3", event_id="Er3", thread="100.1")
        gate.set()
        await stage.settle("Er3")
        middle = await session.turn_record(stage.turn("Er2"))
    assert middle is None or middle.status == "cancelled"  # replaced before it ran
    posts = stage.slack.of("chat.postMessage")
    assert len(posts) == 2  # the first turn's reply and the newest's; none for the middle
    final = [_final_text(stage, ts) for ts in stage.slack.posted]
    assert final[0].endswith("_superseded by a newer message_")
    assert final[-1].endswith("Result: order 3 is packed")


async def test_item4_a_retry_of_a_message_from_before_a_reset_starts_nothing_after_a_restart(
    tmp_path: Path,
) -> None:
    """Issue 28 item 4: after a reset and a restart, Slack's retry of a message the
    session had already taken started a new turn in the new generation."""
    async with staged(tmp_path, ops_agent()) as stage:
        await stage.event("<@B1> where is 5", event_id="Ed1", thread="100.1")
        await stage.settle("Ed1")
        ts = stage.sent["Ed1"]
        await stage.runtime.session("ops", SESSION).reset()
    async with staged(tmp_path, ops_agent()) as again:  # a new process: remembers nothing
        again.sent["Ed1"] = ts
        retried = await again.event("<@B1> where is 5", event_id="Ed1", thread="100.1", retry=1)
        assert retried.status_code == 200
        await again.event("<@B1> where is 6", event_id="Ed2", thread="100.1")
        await again.settle("Ed2")
        session = again.runtime.session("ops", SESSION)
        openings = [m for m in await session.messages() if isinstance(m, turnkit.UserMessage)]
    assert [m.text for m in openings] == ["where is 6"]
    assert len(again.slack.of("chat.postMessage")) == 1
