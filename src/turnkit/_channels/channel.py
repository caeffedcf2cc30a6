"""Channels: how a platform's messages become turns, and a turn's events its replies.

A channel has a ``source`` (``"slack"``, ``"cli"``…), turns a platform payload into an
``InboundEvent`` with ``to_event`` (vouching for ``user.attested`` only where the
platform signs its events) and, if it can reply on its own, renders a turn's event
stream with ``deliver(target, events)``. ``mount_agent`` gives channels the
``ChannelContext`` they drive turns through; ``receive`` starts a turn no person
opened and renders it with the channel's ``deliver``. A reply that fails is
reported with ``ChannelContext.delivery_failed``: logged, and told to the
session's observers as a live ``delivery.failed`` event.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol, Unpack, runtime_checkable

from .._engine.agent import Agent
from .._errors import ConfigurationError, DeliveryError
from .._runtime.approvals import Grant, ResumeRequest
from .._runtime.client import RuntimeClient
from .._runtime.granting import grant_answer
from .._runtime.observe import TurnStream
from .._runtime.session import AgentSession
from .._runtime.session_client import SessionClient
from .._values.events import DeliveryFailedEvent, TurnEvent
from .._values.inbound import InboundEvent, Proactive
from .._values.inputs import InputRequest
from .._values.turn_options import TurnKeywords, TurnOptions, turn_options
from .._values.turns import ResetResult, TurnResult

log = logging.getLogger("turnkit.channels")


@runtime_checkable
class Channel(Protocol):
    """The inbound half every channel has."""

    @property
    def source(self) -> str: ...

    def to_event(self, payload: Any) -> InboundEvent | None:
        """The ``InboundEvent`` for a platform payload, or ``None`` to ignore it."""
        ...


@runtime_checkable
class DeliveringChannel(Channel, Protocol):
    """A channel that can render a turn to a target on its platform by itself."""

    async def deliver(self, target: Any, events: AsyncIterator[TurnEvent]) -> Any:
        """Render ``events`` (ending on the turn's terminal event or its park) to ``target``."""
        ...


class ChannelContext:
    """What a channel drives an agent's turns through; made by ``mount_agent``."""

    def __init__(self, agent: Agent, runtime: RuntimeClient) -> None:
        self.agent = agent
        self.runtime = runtime

    def session(self, session: str) -> SessionClient:
        return self.runtime.session(self.agent.name, session)

    def run_stream(
        self,
        text: str,
        options: TurnOptions | None = None,
        /,
        *,
        session: str,
        **keywords: Unpack[TurnKeywords],
    ) -> TurnStream:
        """Start a turn and return its events as they happen.

        The turn is queued at once (it runs whether or not the stream is read);
        the stream is already listening, and ends on ``turn.completed``,
        ``turn.failed``, ``turn.cancelled`` or ``input.requested``. The options are
        ``SessionClient.start``'s (a ``TurnOptions``, or its fields as keywords).
        """
        agent_session = self.session(session)
        if not isinstance(agent_session, AgentSession):
            raise ConfigurationError(
                "run_stream runs the turn in this process, and a RuntimeClient runs none: "
                "use submit_stream, which stores the turn for the workers"
            )
        tid = agent_session.start(text, turn_options(options, keywords))
        return agent_session.observe(tid)

    async def submit_stream(
        self,
        text: str,
        options: TurnOptions | None = None,
        /,
        *,
        session: str,
        **keywords: Unpack[TurnKeywords],
    ) -> TurnStream:
        """``run_stream``, returning only once the store holds the turn (see
        ``SessionClient.submit``): a crash from then on loses nothing, and a refusal
        read from the store (a parked session, say) is raised here."""
        agent_session = self.session(session)
        tid = await agent_session.submit(text, turn_options(options, keywords))
        # Nothing ran in between: the delivery yields once before its first step, so
        # the stream is listening before the turn emits anything.
        return agent_session.observe(tid)

    async def run(
        self,
        text: str,
        options: TurnOptions | None = None,
        /,
        *,
        session: str,
        **keywords: Unpack[TurnKeywords],
    ) -> str:
        """Run a turn to its answer; raises ``TurnSuspendedError`` if it parks."""
        return await self.session(session).turn(text, turn_options(options, keywords))

    def delivery_failed(self, event: DeliveryFailedEvent) -> None:
        """Report that a channel's reply to a turn failed: logged as an error on
        ``turnkit.channels`` and emitted to the session's observers (the SSE feed,
        the chat page, ``observe``). It is live only: the session's event log is the
        turn's own story, numbered by the delivery that writes it, and a reply that
        failed changes nothing in it. The turn itself runs to its end."""
        log.error(
            "turn %s (session %s): its %s reply to %s failed%s: %s; the turn runs on",
            event.turn_id,
            event.session_id,
            event.channel,
            event.target,
            f" at {event.method}" if event.method else "",
            event.error,
        )
        try:
            self.runtime.sink.emit(event)
        except Exception:
            log.exception("event sink raised on %s; ignored", event.type)

    async def result(self, turn_id: str, *, session: str) -> TurnResult:
        return await self.session(session).result(turn_id)

    async def pending(self, *, session: str) -> InputRequest | None:
        return await self.session(session).pending()

    async def pending_all(self, *, session: str) -> list[InputRequest]:
        return await self.session(session).pending_all()

    async def reset_session(self, *, session: str) -> ResetResult:
        """Archive the session's history and start it afresh (see ``SessionClient.reset``)."""
        return await self.session(session).reset()

    async def resume_stream(
        self,
        *,
        session: str,
        turn_id: str,
        input_id: str,
        value: Any,
        by: str | None = None,
        principal: Any = None,
        granted: Grant | None = None,
        source: str | None = None,
    ) -> TurnStream:
        """Answer the parked turn and return the resumed turn's events:
        ``async for event in await ctx.resume_stream(...)``.

        The answer is checked and stored before this returns, whether or not the
        stream is read. ``by`` and ``principal`` are the answerer as the channel
        verified them. When the request names a policy answerer and no grant is
        passed, the agent's ``authorize_answer`` is asked here (with ``principal``).
        The resume errors of ``SessionClient.resume`` are raised before anything
        is stored. ``source`` names the channel in the answer's record.
        """
        return await self._resume(session, turn_id, input_id, value, by, principal, granted, source)

    async def _resume(
        self,
        session: str,
        turn_id: str,
        input_id: str,
        value: Any,
        by: str | None,
        principal: Any,
        granted: Grant | None,
        source: str | None,
    ) -> TurnStream:
        agent_session = self.session(session)
        if granted is None:
            granted = await self._grant_if_needed(
                agent_session, turn_id, input_id, value, by, principal
            )
        tid = await agent_session.resume(
            turn_id, input_id, value, by=by, granted=granted, source=source
        )
        return agent_session.observe(tid)

    async def resume_delivered(
        self,
        channel: Channel,
        target: Any,
        *,
        session: str,
        turn_id: str,
        input_id: str,
        value: Any,
        by: str | None = None,
        principal: Any = None,
        granted: Grant | None = None,
    ) -> TurnResult:
        """Resume the parked turn and render it with ``channel.deliver`` to ``target``
        (the answer is recorded as come through ``channel.source``)."""
        deliver = _deliver_of(channel)
        # Resume first: the answer is applied whether or not the renderer reads on.
        stream = await self._resume(
            session, turn_id, input_id, value, by, principal, granted, channel.source
        )
        await _render(channel, deliver, target, stream, self.delivery_failed)
        return await self.result(turn_id, session=session)

    async def _grant_if_needed(
        self,
        agent_session: SessionClient,
        turn_id: str,
        input_id: str,
        value: Any,
        by: str | None,
        principal: Any,
    ) -> Grant | None:
        if self.agent.authorize_answer is None:
            return None
        waiting = await agent_session.pending_all()
        request = next((r for r in waiting if r.id == input_id), None)
        if request is None or request.turn_id != turn_id:
            return None  # resume() says what is wrong
        if any(a.kind == "user" and a.user_id == by for a in request.answerers):
            return None  # admitted as the named user; no policy needed
        if not any(a.kind == "policy" for a in request.answerers):
            return None
        return await grant_answer(
            agent_session,
            ResumeRequest(
                turn_id=turn_id, input_id=input_id, value=value, by=by, principal=principal
            ),
        )


def mount_agent(
    agent: Agent,
    runtime: RuntimeClient,
    *,
    channels: Iterable[Channel] = (),
    served_elsewhere: Iterable[str] = (),
) -> ChannelContext:
    """The ``ChannelContext`` for ``agent`` in ``runtime``.

    Pass the ``channels`` that will feed it: a per-source policy (or overlay) for a
    source none of them emits is logged as a warning, once, since it would never apply.
    ``served_elsewhere`` names sources that reach the agent another way (another
    process on the same store, the terminal beside a server): their policies apply
    there, so they are not warned about.
    """
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"mount_agent needs an Agent, got {type(agent).__name__}")
    if runtime.agents.get(agent.name) is not agent:
        raise ConfigurationError(
            f"agent {agent.name!r} is not one of this runtime's agents "
            f"({sorted(runtime.agents)}); pass it to Runtime([...]) first"
        )
    listed = list(channels)
    sources: set[str] = set()
    for channel in listed:
        source = getattr(channel, "source", None)
        if not isinstance(source, str) or not source:
            raise ConfigurationError(f"channel {channel!r} has no source (a non-empty str)")
        sources.add(source)
    if listed:
        for source in agent.unheard_policy_sources(sources | set(served_elsewhere)):
            log.warning(
                "agent %r has a policy for source %r, but no mounted channel emits it "
                "(mounted: %s); it will not apply",
                agent.name,
                source,
                ", ".join(sorted(sources)),
            )
    return ChannelContext(agent, runtime)


async def receive(
    channel: Channel,
    ctx: ChannelContext,
    *,
    seed: str,
    target: Any,
    trigger: Proactive,
    session: str,
    replace: bool = False,
    turn_id: str | None = None,
) -> TurnResult:
    """Start a turn that no person opened and render it with ``channel.deliver``.

    The ``seed`` is stored as a ``trigger`` message attributed to ``trigger.by``, and
    the turn runs under the policy of the channel's source. Raises
    ``ConfigurationError`` before starting anything if ``ctx`` cannot stream or the
    channel cannot deliver; if rendering fails, ``DeliveryError`` names the turn,
    which the runtime still runs to its end. Returns how the turn ended.
    """
    submit_stream = getattr(ctx, "submit_stream", None)
    if not callable(submit_stream):
        raise ConfigurationError(
            f"receive: {type(ctx).__name__} has no submit_stream, so it cannot stream a "
            "turn; pass the ChannelContext from mount_agent"
        )
    deliver = _deliver_of(channel)
    if not isinstance(trigger, Proactive):
        raise ConfigurationError(f"receive: trigger must be a Proactive, got {trigger!r}")
    if not isinstance(seed, str) or not seed.strip():
        raise ConfigurationError("receive: seed must be a non-empty str")
    if trigger.source is None:
        trigger = dataclasses.replace(trigger, source=channel.source)
    elif trigger.source != channel.source:
        raise ConfigurationError(
            f"receive: the trigger names source {trigger.source!r}, but the turn is "
            f"delivered by the {channel.source!r} channel; its policy is the one that applies"
        )
    stream: TurnStream = await submit_stream(
        seed, session=session, trigger=trigger, replace=replace, turn_id=turn_id
    )
    await _render(channel, deliver, target, stream, getattr(ctx, "delivery_failed", None))
    return await ctx.result(stream.turn_id, session=session)


def _deliver_of(channel: Channel) -> Any:
    deliver = getattr(channel, "deliver", None)
    if not callable(deliver):
        raise ConfigurationError(
            f"channel {getattr(channel, 'source', channel)!r} has no deliver(target, events), "
            "so it cannot render a turn by itself"
        )
    return deliver


def delivery_failure(
    exc: BaseException, *, channel: str, target: str, session_id: str, turn_id: str
) -> DeliveryFailedEvent:
    """The ``delivery.failed`` event of a reply stopped by ``exc``: the platform's
    method and error code when the channel raised a ``DeliveryError`` naming them,
    else the exception's type and text."""
    method = exc.method if isinstance(exc, DeliveryError) else None
    code = exc.code if isinstance(exc, DeliveryError) else None
    return DeliveryFailedEvent(
        turn_id=turn_id,
        session_id=session_id,
        channel=channel,
        target=target,
        method=method,
        error=code or f"{type(exc).__name__}: {exc}",
    )


async def _render(
    channel: Channel,
    deliver: Any,
    target: Any,
    events: TurnStream,
    report: Callable[[DeliveryFailedEvent], None] | None,
) -> None:
    """Render ``events`` with ``deliver``; a failure is reported (logged and told to
    observers) and raised as a ``DeliveryError`` naming the turn."""
    try:
        await deliver(target, events)
    except Exception as exc:
        failure = delivery_failure(
            exc,
            channel=channel.source,
            target=target if isinstance(target, str) else repr(target),
            session_id=events.session_id,
            turn_id=events.turn_id,
        )
        if report is not None:
            report(failure)
        raise DeliveryError(
            f"channel {channel.source!r} failed to deliver turn {events.turn_id} to {target!r}: "
            f"{type(exc).__name__}: {exc}; the turn itself still runs to its end",
            method=failure.method,
            code=exc.code if isinstance(exc, DeliveryError) else None,
        ) from exc
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
