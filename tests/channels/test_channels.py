"""Channels: mount_agent's ChannelContext, proactive turns through receive(), and the
terminal channel — on every store."""

from __future__ import annotations

import io
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import turnkit
from turnkit import (
    Agent,
    AnswerCheck,
    Answerers,
    ConfigurationError,
    DeliveryError,
    InboundEvent,
    Proactive,
    SurfacePolicy,
    TerminalChannel,
    ToolContext,
    ToolMessage,
    TriggerMessage,
    TurnEvent,
    User,
    UserMessage,
    mount_agent,
    receive,
    tool,
)
from turnkit.testing import RecordingSink, ScriptedModel, ScriptedReply, tool_call


@dataclass
class RecordingChannel:
    """A test platform: ``deliver`` records what it rendered, per target."""

    source: str = "test"
    rendered: list[tuple[Any, str]] = field(default_factory=list)
    fail_after: int | None = None

    def to_event(self, payload: Any) -> InboundEvent:
        return InboundEvent(
            source=self.source, text=payload["text"], user=User(id=payload["user"], attested=True)
        )

    async def deliver(self, target: Any, events: AsyncIterator[TurnEvent]) -> None:
        async for event in events:
            if self.fail_after is not None and len(self.rendered) >= self.fail_after:
                raise RuntimeError("platform rejected the post")
            shown = event.text if event.type == "message.delta" else event.type
            self.rendered.append((target, shown))


@dataclass
class InboundOnly:
    source: str = "inbound"

    def to_event(self, payload: Any) -> InboundEvent | None:
        return None


def approval_agent(asked: list[Any], authorize: Any = None) -> Agent:
    @tool
    async def deploy(service: str, ctx: ToolContext) -> dict[str, Any]:
        """Deploy a service once someone approves."""
        answers = Answerers.policy("release-manager") if authorize else None
        approved = await ctx.request_input(
            "approve", f"Deploy {service}?", schema={"type": "boolean"}, answerers=answers
        )
        asked.append(approved)
        return {"deployed": bool(approved)}

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage | TriggerMessage):
            return ScriptedReply(
                text="Deploying.", tool_calls=[tool_call("deploy", {"service": "api"})]
            )
        if isinstance(last, ToolMessage):
            return ScriptedReply(text=f"result {last.result}", chunks=2)
        return "?"

    return Agent(
        name="ops", model=ScriptedModel(respond=respond), tools=[deploy], authorize_answer=authorize
    )


async def test_run_stream_yields_the_turn_and_ends_on_its_terminal_event(
    open_runtime: Any,
) -> None:
    agent = Agent(name="ops", model=ScriptedModel([ScriptedReply(text="hello there", chunks=3)]))
    ctx = mount_agent(agent, await open_runtime(agent))
    stream = ctx.run_stream("hi", session="s1")
    assert isinstance(stream.turn_id, str)
    types = [e.type async for e in stream]
    assert types == [
        "turn.started",
        "message.delta",
        "message.delta",
        "message.delta",
        "message.completed",
        "turn.completed",
    ]
    assert (await ctx.result(stream.turn_id, session="s1")).text == "hello there"


async def test_run_stream_ends_on_input_requested_and_resume_stream_finishes_it(
    open_runtime: Any,
) -> None:
    asked: list[Any] = []
    agent = approval_agent(asked)
    ctx = mount_agent(agent, await open_runtime(agent))
    event = InboundEvent(source="slack", text="deploy", user=User(id="U1", attested=True))
    stream = ctx.run_stream("deploy api", session="s1", event=event)
    events = [e async for e in stream]
    assert events[-1].type == "input.requested"
    request = await ctx.pending(session="s1")
    assert request is not None and request.prompt == "Deploy api?"
    resumed = await ctx.resume_stream(
        session="s1", turn_id=stream.turn_id, input_id="approve", value=True, by="U1"
    )
    assert resumed.turn_id == stream.turn_id
    types = [e.type async for e in resumed]
    assert types[-1] == "turn.completed"
    assert "action.completed" in types
    assert asked == [True]


async def test_resume_stream_carries_the_principal_to_authorize_answer(open_runtime: Any) -> None:
    checks: list[AnswerCheck] = []

    async def authorize(check: AnswerCheck) -> bool:
        checks.append(check)
        return bool(check.principal and check.principal.get("role") == "release-manager")

    asked: list[Any] = []
    agent = approval_agent(asked, authorize)
    ctx = mount_agent(agent, await open_runtime(agent))
    stream = ctx.run_stream("deploy api", session="s1")
    assert [e async for e in stream][-1].type == "input.requested"
    with pytest.raises(turnkit.ResumeAuthorizationError):
        await ctx.resume_stream(
            session="s1",
            turn_id=stream.turn_id,
            input_id="approve",
            value=True,
            by="U2",
            principal={"role": "intern"},
        )
    assert asked == [] and await ctx.pending(session="s1") is not None
    unread = await ctx.resume_stream(
        session="s1",
        turn_id=stream.turn_id,
        input_id="approve",
        value=True,
        by="U3",
        principal={"role": "release-manager"},
    )
    # Applied although nobody reads the stream: the turn runs on by itself.
    assert (await ctx.result(unread.turn_id, session="s1")).status == "completed"
    await unread.aclose()
    assert asked == [True]
    assert [(c.by, c.principal["role"]) for c in checks] == [
        ("U2", "intern"),
        ("U3", "release-manager"),
    ]


async def test_resume_delivered_renders_the_resumed_turn(open_runtime: Any) -> None:
    asked: list[Any] = []
    agent = approval_agent(asked)
    channel = RecordingChannel()
    ctx = mount_agent(agent, await open_runtime(agent), channels=[channel])
    result = await receive(
        channel,
        ctx,
        seed="deploy",
        target="#ops",
        trigger=Proactive(by="cron:nightly"),
        session="s1",
    )
    assert result.status == "suspended"
    assert channel.rendered[-1] == ("#ops", "input.requested")
    done = await ctx.resume_delivered(
        channel, "#ops", session="s1", turn_id=result.turn_id, input_id="approve", value=False
    )
    assert done.status == "completed" and done.text == "result {'deployed': False}"
    assert channel.rendered[-1] == ("#ops", "turn.completed")
    assert ("#ops", "result {'depl") in channel.rendered  # the deltas were rendered


async def test_run_returns_the_text_and_reset_session_archives(open_runtime: Any) -> None:
    agent = Agent(name="ops", model=ScriptedModel(["one", "two"]))
    ctx = mount_agent(agent, await open_runtime(agent))
    assert await ctx.run("hi", session="s1") == "one"
    reset = await ctx.reset_session(session="s1")
    assert reset.previous_session == "s1#g0"
    assert await ctx.session("s1").messages() == []
    assert await ctx.run("again", session="s1") == "two"


async def test_receive_stores_the_seed_as_a_trigger_and_delivers_it(open_runtime: Any) -> None:
    model = ScriptedModel([ScriptedReply(text="Three threads are open.", chunks=2)])
    agent = Agent(name="ops", model=model)
    channel = RecordingChannel()
    ctx = mount_agent(agent, await open_runtime(agent), channels=[channel])
    result = await receive(
        channel,
        ctx,
        seed="Summarize today's open threads.",
        target={"channel_id": "C-ops"},
        trigger=Proactive(by="cron:daily"),
        session="daily",
    )
    assert result.status == "completed" and result.text == "Three threads are open."
    assert [shown for _, shown in channel.rendered] == [
        "turn.started",
        "Three thread",
        "s are open.",
        "message.completed",
        "turn.completed",
    ]
    assert all(target == {"channel_id": "C-ops"} for target, _ in channel.rendered)
    opening = (await ctx.session("daily").messages())[0]
    assert isinstance(opening, TriggerMessage)
    assert (opening.text, opening.by) == ("Summarize today's open threads.", "cron:daily")


async def test_receive_refuses_before_starting_anything(open_runtime: Any) -> None:
    agent = Agent(name="ops", model=ScriptedModel([]))
    runtime = await open_runtime(agent)
    ctx = mount_agent(agent, runtime)
    with pytest.raises(ConfigurationError, match="'inbound' has no deliver"):
        await receive(
            InboundOnly(), ctx, seed="go", target=None, trigger=Proactive(by="x"), session="s1"
        )
    with pytest.raises(ConfigurationError, match="has no submit_stream, so it cannot stream"):
        await receive(
            RecordingChannel(),
            object(),  # type: ignore[arg-type]
            seed="go",
            target=None,
            trigger=Proactive(by="x"),
            session="s1",
        )
    assert await runtime.sessions() == []


async def test_a_failing_deliver_raises_but_the_turn_still_completes(
    open_runtime: Any, sink: RecordingSink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("ERROR", logger="turnkit.channels")
    agent = Agent(name="ops", model=ScriptedModel(["posted"]))
    channel = RecordingChannel(fail_after=1)
    ctx = mount_agent(agent, await open_runtime(agent), channels=[channel])
    with pytest.raises(DeliveryError, match=r"failed to deliver turn \w+ .*platform rejected"):
        await receive(
            channel, ctx, seed="go", target="#x", trigger=Proactive(by="cron:x"), session="s1"
        )
    # Reported to observers (live) and to the log, naming the turn.
    (failed,) = [e for e in sink.events if isinstance(e, turnkit.DeliveryFailedEvent)]
    assert (failed.session_id, failed.channel, failed.target, failed.method) == (
        "s1",
        "test",
        "#x",
        None,
    )
    assert failed.error == "RuntimeError: platform rejected the post"
    (logged,) = [r.getMessage() for r in caplog.records if r.name == "turnkit.channels"]
    assert f"turn {failed.turn_id}" in logged and "platform rejected" in logged
    session = ctx.session("s1")
    (info,) = await ctx.runtime.sessions()
    assert info.status == "idle"
    assert [type(m).__name__ for m in await session.messages()] == [
        "TriggerMessage",
        "AssistantMessage",
    ]


async def test_mount_checks_the_agent_and_warns_once_per_unused_policy(
    open_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent(
        name="ops",
        model=ScriptedModel([]),
        source_instructions={"slack": "Short.", "test": "Test."},
        surfaces={"slack": SurfacePolicy(mode="append")},
    )
    runtime = await open_runtime(agent)
    other = Agent(name="ops", model=ScriptedModel([]))
    with pytest.raises(ConfigurationError, match="not one of this runtime's agents"):
        mount_agent(other, runtime)
    with pytest.raises(ConfigurationError, match="has no source"):
        mount_agent(agent, runtime, channels=[object()])  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING, logger="turnkit.channels"):
        mount_agent(agent, runtime, channels=[RecordingChannel()])
        mount_agent(agent, runtime, channels=[RecordingChannel()])  # a host mounting again
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "policy for source 'slack', but no mounted channel emits it" in warnings[0]


async def test_a_source_served_elsewhere_is_not_warned_about(
    open_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``turnkit dev --slack`` beside ``turnkit run``: the example's ``cli`` overlay
    applies to the terminal, so mounting Slack alone says nothing of it."""
    agent = Agent(name="ops", model=ScriptedModel([]), source_instructions={"cli": "Terse."})
    runtime = await open_runtime(agent)
    with caplog.at_level(logging.WARNING, logger="turnkit.channels"):
        mount_agent(agent, runtime, channels=[RecordingChannel()], served_elsewhere=["cli"])
    assert [r.getMessage() for r in caplog.records] == []


# -- the terminal channel ----------------------------------------------------------


class Typing:
    """A person at the terminal typing ``answers`` in turn; ``prompts``: what they were asked."""

    def __init__(self, *answers: str) -> None:
        self._answers = iter(answers)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return next(self._answers)


async def test_the_terminal_channel_renders_and_asks_at_the_prompt(open_runtime: Any) -> None:
    asked: list[Any] = []
    agent = approval_agent(asked)
    ctx = mount_agent(agent, await open_runtime(agent))
    out = io.StringIO()
    person = Typing("maybe", "yes")
    terminal = TerminalChannel(out=out, ask=person, user="local:alice")
    result = await terminal.converse(ctx, "deploy api", session="cli")
    assert result.status == "completed" and asked == [True]
    # Asked at the prompt only (not printed first as well); "maybe" was asked again.
    assert person.prompts == ["  ? Deploy api? (yes/no) > ", "  ? Deploy api? (yes/no) > "]
    shown = out.getvalue()
    assert "Deploying." in shown
    assert '→ deploy {"service": "api"}' in shown
    assert "Deploy api?" not in shown
    assert "! answer yes or no" in shown
    assert '← deploy: {"deployed": true}' in shown
    opening = (await ctx.session("cli").messages())[0]
    assert isinstance(opening, UserMessage)
    event = terminal.to_event("hi")
    assert (event.source, event.user) == ("cli", User(id="local:alice", attested=True))
    # The session the terminal opened is its user's.
    assert (await ctx.runtime.store.session("cli").load()).owner == "local:alice"


async def test_the_terminal_offers_the_decisions_on_a_proposed_call(open_runtime: Any) -> None:
    sent: list[dict[str, Any]] = []

    def send(data: dict[str, Any], actx: turnkit.ActionContext) -> str:
        sent.append(data)
        return f"sent to {data['to']}"

    email = turnkit.define_action(
        name="email",
        description="Send an e-mail.",
        input_schema={
            "type": "object",
            "properties": {"to": {"type": "string", "minLength": 3}},
            "required": ["to"],
        },
        run=send,
        approval=turnkit.Approval(allowed=("approve", "edit", "reject")),
    )
    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("email", {"to": "ann@x"})]), "Done."]
    )
    agent = Agent(name="mail", model=model, tools=[email])
    ctx = mount_agent(agent, await open_runtime(agent))
    out = io.StringIO()
    person = Typing("perhaps", "respond call her", 'edit {"to": "x"}', 'edit {"to": "bo@x"}')
    terminal = TerminalChannel(out=out, ask=person, user="local:alice")
    result = await terminal.converse(ctx, "mail ann", session="cli")
    assert result.status == "completed" and sent == [{"to": "bo@x"}]
    assert (
        person.prompts[0]
        == "  ? Allow email with these arguments? (approve | edit {json} | reject [why]) > "
    )
    shown = out.getvalue()
    assert 'proposed: email {"to": "ann@x"}' in shown
    assert "! answer approve, edit {json}, reject [why] or respond <text>" in shown
    assert "'respond' is not allowed here" in shown  # the resume's check, said at the prompt
    assert "the edited arguments do not match the tool's input schema" in shown
    (record,) = await ctx.session("cli").answers()
    assert (record.decision, record.source) == (turnkit.Decision.edit({"to": "bo@x"}), "cli")


async def test_the_terminal_answers_a_question_left_by_an_earlier_run(open_runtime: Any) -> None:
    asked: list[Any] = []
    agent = approval_agent(asked)
    ctx = mount_agent(agent, await open_runtime(agent))
    first = TerminalChannel(out=io.StringIO(), ask=lambda _: (_ for _ in ()).throw(EOFError()))
    with pytest.raises(EOFError):
        await first.converse(ctx, "deploy api", session="cli")
    assert await ctx.pending(session="cli") is not None
    out = io.StringIO()
    second = TerminalChannel(out=out, ask=lambda _: "n")
    result = await second.converse(ctx, "deploy api", session="cli")
    assert result.status == "completed"
    assert asked == [False, False]  # the earlier turn answered, then the new one
    assert "waiting on turn" in out.getvalue()


async def test_receive_applies_the_channels_source_policy(open_runtime: Any) -> None:
    ran: list[str] = []

    @tool
    def post_everywhere() -> str:
        """Post to every channel."""
        ran.append("posted")
        return "posted"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], TriggerMessage):
            return ScriptedReply(tool_calls=[tool_call("post_everywhere", {})])
        return f"then: {messages[-1].result}"

    model = ScriptedModel(respond=respond)
    agent = Agent(
        name="ops",
        model=model,
        tools=[post_everywhere],
        surfaces={"slack": SurfacePolicy(deny_tools=("post_everywhere",))},
    )
    channel = RecordingChannel(source="slack")
    ctx = mount_agent(agent, await open_runtime(agent), channels=[channel])
    result = await receive(
        channel, ctx, seed="go", target="#ops", trigger=Proactive(by="cron:x"), session="s1"
    )
    assert result.text == "then: {'error': 'unknown tool: post_everywhere'}"
    assert ran == [] and model.calls[0].tools == ()
    with pytest.raises(ConfigurationError, match="names source 'cli', but the turn is delivered"):
        await receive(
            channel,
            ctx,
            seed="go",
            target="#ops",
            trigger=Proactive(by="cron:x", source="cli"),
            session="s2",
        )
