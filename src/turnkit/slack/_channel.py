"""``SlackChannel``: Slack's Events API and interactivity as turns, replies in threads.

Every request is verified with the app's signing secret (slack_sdk's
``SignatureVerifier``: HMAC-SHA256 over ``v0:timestamp:body``, a five-minute
window, a constant-time compare) before anything is read from it; one that fails
gets 401 and starts nothing. Slack wants an answer within three seconds, so a
message is acknowledged at once and its turn runs in the background. The message
(its channel and ts) keys the turn, so Slack's retry of an event never starts a
second one.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qs

from pydantic import Field, TypeAdapter
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._access.authorize import Action, Authorize, SessionAccess, allowed
from .._access.principal import Principal
from .._channels.channel import ChannelContext, delivery_failure
from .._errors import (
    ConfigurationError,
    InvalidAnswerError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionSuspendedError,
)
from .._runtime.runtime import Runtime
from .._seams.store import NO_MESSAGES
from .._values.events import TurnEvent
from .._values.inbound import InboundEvent, User
from .._values.inputs import InputRequest
from ..server import BodyLimit
from ._pacing import EditPacer
from ._payloads import (
    BlockActions,
    ButtonValue,
    DecisionMetadata,
    Envelope,
    FormMetadata,
    MessageEvent,
    ValidationError,
    ViewSubmission,
)
from ._reminders import ReminderPoster
from ._render import (
    APPROVE,
    DECIDE,
    DECIDED,
    DECISION_FORM,
    DENY,
    FORM,
    FORM_BLOCK,
    FORM_FIELD,
    OPEN_FORM,
    SlackReply,
    SlackThread,
    answer_form,
    answered_blocks,
    decision_form,
    decision_value,
    form_value,
)

log = logging.getLogger("turnkit.slack")
#: Which decision each decision button takes.
_DECISION_OF = {action: kind for kind, action in DECIDE.items()}

SOURCE = "slack"
#: The metadata of a form turnkit opened: an answer form, or a decision form.
_Form = TypeVar("_Form", bound=FormMetadata)
#: Largest request body the Slack routes read. Slack's event callbacks and
#: interaction payloads are a few KiB; anything far larger is not Slack, and is
#: refused (413) before it is read, signature or none.
MAX_BODY_BYTES = 256 * 1024
#: A mention of a user or bot at the start of a message.
_MENTION = re.compile(r"^\s*<@[A-Z0-9]+(?:\|[^>]*)?>")
#: Message subtypes that are not a person writing (edits, deletions, joins, bots).
_HUMAN_SUBTYPES = {None, "thread_broadcast", "file_share"}


class SlackChannel:
    """The Slack channel of one Slack app (see ``slack_channel``)."""

    source = SOURCE

    def __init__(
        self,
        *,
        signing_secret: str,
        client: AsyncWebClient,
        replace_in_flight: bool = False,
        update_interval: float = 1.0,
        authorize: Authorize | None = None,
        pacer: EditPacer | None = None,
    ) -> None:
        self.verifier = SignatureVerifier(signing_secret)
        self.client = client
        self.replace_in_flight = replace_in_flight
        #: Shared by every reply this channel renders: Slack's limit is per channel.
        self.pacer = pacer if pacer is not None else EditPacer(update_interval)
        self.authorize = authorize
        #: The poster of each runtime whose reminders this channel posts (by id).
        self._reminders: dict[int, ReminderPoster] = {}

    def post_reminders(self, runtime: Runtime, *, agent: str | None = None) -> ReminderPoster:
        """Post each ``input.reminder`` of ``runtime`` (of a Slack session of ``agent``,
        or of any agent) in the thread that asked, as one message saying the question
        is still open and when it is due. The event comes to the sink of the process
        that fires the store's timers (a process that runs turns), so that process
        must call this: ``app(ctx)`` calls it for its runtime; a deployment whose
        turns and timers run in workers calls it in each worker (one of them fires).
        Called again for the same runtime, it widens the one poster (one message
        per reminder however often it is called)."""
        poster = self._reminders.get(id(runtime))
        if poster is None or poster.runtime is not runtime:
            poster = ReminderPoster(self.client, runtime, agent)
            self._reminders[id(runtime)] = poster
        else:
            poster.widen(agent)
        return poster

    def _reply(self, thread: SlackThread) -> SlackReply:
        """A renderer of one turn into ``thread``, paced with the channel's other replies."""
        return SlackReply(self.client, thread, self.pacer)

    # -- the Channel protocol ------------------------------------------------------

    def to_event(self, payload: Any) -> InboundEvent | None:
        """The inbound event of an Events API callback (``app_mention``, a message in
        a thread, a direct message), or ``None`` for what is not a person talking to
        the bot."""
        if not isinstance(payload, dict) or payload.get("type") != "event_callback":
            return None
        event = payload.get("event")
        if not isinstance(event, dict):
            return None
        kind = event.get("type")
        if kind not in ("app_mention", "message"):
            return None
        if event.get("bot_id") or event.get("subtype") not in _HUMAN_SUBTYPES:
            return None  # the bot's own messages, edits and the like
        if kind == "message" and event.get("thread_ts") is None and not _is_direct(event):
            return None  # a plain channel message: only mentions and threads are for us
        user, text = event.get("user"), event.get("text")
        if not isinstance(user, str) or not user or not isinstance(text, str):
            return None
        text = _MENTION.sub("", text, count=1).strip()  # "<@BOT> where is 17" → "where is 17"
        if not text:
            return None
        # Slack signed the request, so the user id is Slack's word, not the caller's.
        return InboundEvent(
            source=SOURCE,
            text=text,
            user=User(id=user, attested=True),
            channel_id=str(event.get("channel") or ""),
            thread_id=str(event.get("thread_ts") or event.get("ts") or ""),
            kind=str(kind),
            raw=payload,
        )

    async def deliver(self, target: Any, events: AsyncIterator[TurnEvent]) -> None:
        """Render a turn into ``target`` (a ``SlackThread``, or a dict with
        ``channel_id`` and optionally ``thread_ts``)."""
        thread = _thread_of(target)
        await self._reply(thread).render(events)

    # -- the ASGI app ---------------------------------------------------------------

    def app(self, ctx: ChannelContext) -> Starlette:
        """The routes Slack calls, for ``ctx``'s agent: ``POST /events`` (the Events
        API request URL) and ``POST /interactivity`` (the interactivity request URL).
        Mount it where the app settings point, e.g. ``app.mount("/slack", …)``.
        Reminders of the agent's open questions are posted in their threads from
        this process's runtime when it is a ``Runtime`` (it fires the timers; on an
        HTTP node's ``RuntimeClient``, call ``post_reminders`` in the workers)."""
        handler = _Handler(self, ctx)
        if isinstance(ctx.runtime, Runtime):  # else the workers fire the timers
            self.post_reminders(ctx.runtime, agent=ctx.agent.name)
        return Starlette(
            routes=[
                Route("/events", handler.events, methods=["POST"]),
                Route("/interactivity", handler.interactivity, methods=["POST"]),
            ],
            middleware=[Middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)],
        )


def _is_direct(event: dict[str, Any]) -> bool:
    """A message in a direct conversation with the bot (its App Home's Messages tab):
    all of it is for the bot, mentioned or not, threaded or not."""
    return event.get("type") == "message" and event.get("channel_type") == "im"


def turn_of(payload: dict[str, Any]) -> str:
    """The turn a message starts, keyed by the message itself (its channel and ts):
    Slack's retries of an event, and the ``app_mention`` and ``message`` events
    one message in a thread produces, all name the same turn."""
    event = payload["event"]
    return f"slack-{event['channel']}-{event['ts']}"


def session_of(payload: dict[str, Any]) -> str:
    """One session per thread: ``slack:<team>:<channel>:<thread_ts>``. A message
    outside a thread (a mention in a channel, a direct message) starts the thread
    of its reply, and so a session of its own."""
    event = payload["event"]
    thread = event.get("thread_ts") or event["ts"]
    team = payload.get("team_id") or event.get("team") or ""
    return f"slack:{team}:{event['channel']}:{thread}"


def _thread_of(target: Any) -> SlackThread:
    if isinstance(target, SlackThread):
        return target
    if isinstance(target, dict) and isinstance(target.get("channel_id"), str):
        return SlackThread(channel=target["channel_id"], thread_ts=target.get("thread_ts"))
    raise ConfigurationError(
        f"a Slack target is a SlackThread or {{'channel_id': …, 'thread_ts'?: …}}, got {target!r}"
    )


#: How many of a session's most recent resets a retried message is looked for
#: behind (Slack retries within minutes: more resets than this meanwhile is moot).
_RESETS_LOOKED_AT = 2
#: How many event ids a handler remembers having taken (Slack retries within minutes).
_REMEMBERED = 10_000


class _Handler:
    def __init__(self, channel: SlackChannel, ctx: ChannelContext) -> None:
        self.channel = channel
        self.ctx = ctx
        #: Turn ids this process took, checked before any await: a retry arriving
        #: while the first delivery reads the store is still seen as a retry.
        self._taken: OrderedDict[str, None] = OrderedDict()

    def _take(self, turn_id: str) -> bool:
        if turn_id in self._taken:
            return False
        self._taken[turn_id] = None
        while len(self._taken) > _REMEMBERED:
            self._taken.popitem(last=False)
        return True

    async def _verified(self, request: Request) -> bytes | None:
        """The body, once Slack's signature over it checks out; ``None`` (a 401)
        otherwise. The headers are checked for shape first, since the verifier
        takes them as given (a timestamp that is no number, a body that is not
        UTF-8 would raise inside it)."""
        body = await request.body()
        timestamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        problem = _header_problem(timestamp, signature)
        if problem is None:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                problem = "the body is not UTF-8"
        if problem is None and not self.channel.verifier.is_valid(body, timestamp, signature):
            problem = "the signature does not match"
        if problem is not None:
            log.warning("Slack: refused %s: %s", request.url.path, problem)
            return None
        return body

    async def events(self, request: Request) -> Response:
        body = await self._verified(request)
        if body is None:
            return _unauthorized()
        try:
            envelope = Envelope.model_validate_json(body)
            if envelope.type == "url_verification":
                return JSONResponse({"challenge": envelope.challenge})
            event = envelope.event or {}
            if envelope.type == "event_callback" and event.get("type") in _TURN_EVENTS:
                MessageEvent.model_validate(event)
        except ValidationError as exc:
            return _malformed(request, exc)
        payload = json.loads(body)  # its shape is known now, and its depth bounded
        inbound = self.channel.to_event(payload)
        if inbound is None or not isinstance(payload["event"].get("ts"), str):
            return Response(status_code=200)  # acknowledged, and nothing to do
        retry = request.headers.get("x-slack-retry-num") is not None
        self._start(payload, inbound, turn_of(payload), retry=retry)
        return Response(status_code=200)

    def _start(
        self, payload: dict[str, Any], inbound: InboundEvent, turn_id: str, *, retry: bool
    ) -> None:
        session_id = session_of(payload)
        event = payload["event"]
        thread = SlackThread(
            channel=event["channel"], thread_ts=event.get("thread_ts") or event["ts"]
        )
        session = self.ctx.session(session_id)
        runtime = self.ctx.runtime
        if not self._take(turn_id):
            return  # Slack's retry of an event this process took

        async def run() -> None:
            # Taken by another process, or before a restart: the turn is stored, and
            # recovery (not a second reply) finishes it.
            if await session.turn_record(turn_id) is not None:
                return
            if retry and await self._before_a_reset(session_id, turn_id):
                return  # Slack's retry of a message the session had before its reset
            if event.get("type") == "message" and not _is_direct(event):
                # Slack sends every thread reply of a channel the bot is in; only
                # threads the bot already talks in (a session) are for it.
                known = await self.ctx.runtime.store.session(session_id).load(
                    from_index=NO_MESSAGES
                )
                if known.agent is None:
                    return
            user = inbound.user.id if inbound.user is not None else ""
            if not await self._allowed(user, _claims(payload), session_id, "turn"):
                await self._tell(thread, user, "You may not use this agent here.")
                return
            try:
                # Stored before it is answered, so a node that only stores turns
                # (a RuntimeClient) serves Slack as a runtime does.
                tid = await session.submit(
                    inbound.text,
                    event=inbound,
                    turn_id=turn_id,
                    replace=self.channel.replace_in_flight,
                )
            except SessionSuspendedError:
                await self.channel.client.chat_postMessage(
                    channel=thread.channel,
                    thread_ts=thread.thread_ts,
                    text="This thread is waiting for an answer above; answer it first.",
                )
                return
            reply = self.channel._reply(thread)
            await self._render(reply, session.observe(tid), session_id, tid)

        runtime.spawn(_logged(run(), f"the Slack message starting turn {turn_id}"))

    async def _before_a_reset(self, session_id: str, turn_id: str) -> bool:
        """Whether the turn a Slack retry names is in one of the session's last
        archived generations: the message was taken before a reset, and its retry
        (which may come after a restart, when this process remembers nothing) must
        not start it again in the new generation. Only retries pay this read."""
        history = self.ctx.session(session_id)
        for generation in sorted(await history.generations())[-_RESETS_LOOKED_AT:]:
            if any(m.turn_id == turn_id for m in await history.archived_messages(generation)):
                return True
        return False

    async def interactivity(self, request: Request) -> Response:
        body = await self._verified(request)
        if body is None:
            return _unauthorized()
        raw = parse_qs(body.decode()).get("payload")
        if not raw:
            return JSONResponse({"error": "the form has no payload field"}, status_code=400)
        try:
            interaction = _INTERACTION.validate_json(raw[0])
            if isinstance(interaction, ViewSubmission):
                if interaction.view.callback_id == DECISION_FORM:
                    return await self._decided(interaction)
                return await self._submitted(interaction)
            action = interaction.actions[0]
            if action.action_id not in (OPEN_FORM, APPROVE, DENY, *_DECISION_OF):
                return Response(status_code=200)  # not a button turnkit made
            answer = ButtonValue.model_validate_json(action.value).model_dump()
        except ValidationError as exc:
            return _malformed(request, exc)
        user = interaction.user.id
        message = interaction.message
        thread = SlackThread(
            channel=interaction.channel.id,
            thread_ts=(message.thread_ts or message.ts) if message is not None else None,
        )
        claims = _claims(json.loads(raw[0]))
        if action.action_id == OPEN_FORM:
            if interaction.trigger_id is not None:
                opening = self._open_form(answer, user, thread, interaction.trigger_id)
                self.ctx.runtime.spawn(_logged(opening, f"the Answer click of {user}"))
            return Response(status_code=200)
        question = message.ts if message is not None else None
        kind = _DECISION_OF.get(action.action_id or "")
        if kind is not None and kind != "approve":
            if interaction.trigger_id is not None:
                opening = self._open_decision(
                    answer, kind, user, thread, interaction.trigger_id, question
                )
                self.ctx.runtime.spawn(_logged(opening, f"the {kind} click of {user}"))
            return Response(status_code=200)
        value: Any = action.action_id == APPROVE
        outcome = "Approved" if value else "Denied"
        if kind == "approve":
            value, outcome = {"decision": "approve"}, DECIDED["approve"]
        resuming = self._resume(
            answer, value, user, thread, claims, question=question, outcome=outcome
        )
        self.ctx.runtime.spawn(_logged(resuming, f"the {action.action_id} click of {user}"))
        return Response(status_code=200)

    async def _tell(self, thread: SlackThread, user: str, text: str) -> None:
        """A message only ``user`` sees, in the thread it concerns (on mobile, one
        sent to the channel is never seen from inside the thread)."""
        await self.channel.client.chat_postEphemeral(
            channel=thread.channel, thread_ts=thread.thread_ts, user=user, text=text
        )

    async def _open_form(
        self, answer: dict[str, Any], user: str, thread: SlackThread, trigger_id: str
    ) -> None:
        """Open the form of a parked question (Slack's trigger id lasts three seconds,
        so this runs at once); a question already answered says so instead."""
        request = await self._open_question(answer)
        if request is None:
            await self._tell(thread, user, "This question was already answered.")
            return
        metadata = json.dumps({**answer, "channel": thread.channel, "thread": thread.thread_ts})
        await self.channel.client.views_open(
            trigger_id=trigger_id, view=answer_form(request, metadata)
        )

    async def _open_decision(
        self,
        answer: dict[str, Any],
        kind: str,
        user: str,
        thread: SlackThread,
        trigger_id: str,
        question: str | None,
    ) -> None:
        """Open the form of an Edit…, Reject… or Respond… click on a proposed call."""
        request = await self._open_question(answer)
        if request is None or request.decision is None:
            await self._tell(thread, user, "This question was already answered.")
            return
        metadata = json.dumps(
            {
                **answer,
                "channel": thread.channel,
                "thread": thread.thread_ts,
                "kind": kind,
                "question": question,
            }
        )
        await self.channel.client.views_open(
            trigger_id=trigger_id, view=decision_form(request, kind, metadata)
        )

    async def _decided(self, submission: ViewSubmission) -> Response:
        """A decision form's decision: checked and stored before Slack is answered (a
        refused one is shown in the form: edits the tool's schema refuses, say); then
        the question says what was decided and the resumed turn renders."""
        return await self._resume_from_form(
            submission,
            DecisionMetadata,
            lambda metadata, _request, text: decision_value(metadata.kind, text),
        )

    async def _submitted(self, submission: ViewSubmission) -> Response:
        """A form's answer: checked and stored before Slack is answered, so a wrong
        one is shown in the form itself; the resumed turn renders in the thread."""
        view = submission.view
        if view.callback_id != FORM:
            return Response(status_code=200)
        return await self._resume_from_form(
            submission, FormMetadata, lambda _metadata, request, text: form_value(request, text)
        )

    async def _resume_from_form(
        self,
        submission: ViewSubmission,
        made: type[_Form],
        value_of: Callable[[_Form, InputRequest, str], Any],
    ) -> Response:
        """Store a submitted form's answer (``value_of`` its metadata, the open question
        and the text entered; a ``ValueError`` it or the store raises is shown under the
        form's field) and render the resumed turn in the thread; a decision form also
        marks its question decided. ``made``: the metadata the form was made with."""
        view = submission.view
        try:
            metadata = made.model_validate_json(view.private_metadata)
            field = view.state.entered[FORM_BLOCK][FORM_FIELD]
        except (ValidationError, KeyError):
            return JSONResponse({"error": "not a form turnkit made"}, status_code=400)
        text = field.value or ""
        answer = metadata.model_dump()
        user = submission.user.id
        thread = SlackThread(channel=metadata.channel, thread_ts=metadata.thread)
        claims = {
            "team": submission.team.id if submission.team is not None else "",
            "channel": thread.channel,
        }
        request = await self._open_question(answer)
        if request is None:
            return _form_error("This question was already answered.")
        if not await self._may_answer(answer, user, claims):
            return _form_error("You may not answer this question.")
        try:
            stream = await self.ctx.resume_stream(
                session=metadata.session,
                turn_id=request.turn_id,
                input_id=request.id,
                value=value_of(metadata, request, text),
                by=user,
                source=SOURCE,
            )
        except ResumeAuthorizationError:
            return _form_error("You may not answer this question.")
        except ResumeConflictError:
            return _form_error("This question was already answered.")
        except ValueError as exc:  # InvalidAnswerError among them
            return _form_error(str(exc))
        if isinstance(metadata, DecisionMetadata) and metadata.question is not None:
            await self._answered(thread, metadata.question, DECIDED[metadata.kind], user)
        reply = self.channel._reply(thread)
        self.ctx.runtime.spawn(self._render(reply, stream, metadata.session, request.turn_id))
        return Response(status_code=200)

    async def _open_question(self, answer: dict[str, Any]) -> InputRequest | None:
        """The parked question a button or form answers, if it is still open (the
        session may wait on several)."""
        waiting = await self.ctx.pending_all(session=str(answer["session"]))
        wanted = (answer["turn"], answer["input"])
        return next((r for r in waiting if (r.turn_id, r.id) == wanted), None)

    async def _may_answer(self, answer: dict[str, Any], user: str, claims: dict[str, str]) -> bool:
        """A named answerer may answer (the question's answerers then decide); anyone
        else needs ``authorize`` to allow ``resume``, as over HTTP."""
        if self.channel.authorize is None:
            return True
        session_id = str(answer["session"])
        request = await self._open_question(answer)
        if request is not None and any(
            (a.kind == "user" and a.user_id == user) or a.kind == "policy"
            for a in request.answerers
        ):
            return True
        return await self._allowed(user, claims, session_id, "resume")

    async def _allowed(
        self, user: str, claims: dict[str, str], session_id: str, action: Action
    ) -> bool:
        """What the channel's ``authorize`` says (everyone in the thread, without one)."""
        authorize = self.channel.authorize
        if authorize is None:
            return True
        snap = await self.ctx.runtime.store.session(session_id).load(from_index=NO_MESSAGES)
        principal = Principal(id=user, claims=claims)
        access = SessionAccess(
            agent=self.ctx.agent.name,
            session_id=session_id,
            owner=snap.owner,
            action=action,
            exists=snap.agent is not None,
        )
        return await allowed(authorize, principal, access)

    async def _resume(
        self,
        answer: dict[str, Any],
        value: Any,
        user: str,
        thread: SlackThread,
        claims: dict[str, str],
        *,
        question: str | None = None,
        outcome: str,
    ) -> None:
        """Answer a question from its button (yes or no; approving a proposed call);
        ``question`` is the message that asked it, edited once the answer is taken
        to say ``outcome`` (see ``_answered``)."""
        if not await self._may_answer(answer, user, claims):
            await self._tell(thread, user, "You may not answer this question.")
            return
        try:
            stream = await self.ctx.resume_stream(
                session=str(answer["session"]),
                turn_id=str(answer["turn"]),
                input_id=str(answer["input"]),
                value=value,
                by=user,
                source=SOURCE,
            )
        except ResumeAuthorizationError:
            await self._tell(thread, user, "You may not answer this question.")
            return
        except (ResumeConflictError, InvalidAnswerError):
            await self._tell(thread, user, "This question was already answered.")
            return
        if question is not None:
            await self._answered(thread, question, outcome, user)
        reply = self.channel._reply(thread)
        await self._render(reply, stream, str(answer["session"]), str(answer["turn"]))

    async def _answered(self, thread: SlackThread, question: str, outcome: str, user: str) -> None:
        """Edit the message that asked a question once it is answered: its buttons go,
        and it says how, by whom and when (nobody else clicks a stale button). A
        failure here is logged: the answer itself is stored."""
        try:
            await self.channel.client.chat_update(
                channel=thread.channel,
                ts=question,
                text=f"{outcome} by <@{user}>",
                blocks=answered_blocks(outcome, user),
            )
        except Exception as exc:
            log.warning("Slack: could not mark question %s answered: %s", question, exc)

    async def _render(
        self, reply: SlackReply, stream: AsyncIterator[TurnEvent], session_id: str, turn_id: str
    ) -> None:
        """Render a turn Slack asked for. A Web API error Slack's retries did not cure
        (``channel_not_found``, a revoked token) stops this reply and is reported: a
        log record and a live ``delivery.failed`` event naming the turn, whose own
        run goes on regardless (it is in the store: ``turnkit show``)."""
        try:
            await reply.render(stream)
        except Exception as exc:
            self.ctx.delivery_failed(
                delivery_failure(
                    exc,
                    channel=SOURCE,
                    target=reply.thread.channel,
                    session_id=session_id,
                    turn_id=turn_id,
                )
            )
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()


def _claims(payload: dict[str, Any]) -> dict[str, str]:
    """What Slack signed about where a request came from: its team and channel."""
    found = payload.get("event")
    event: dict[str, Any] = found if isinstance(found, dict) else {}
    team = payload.get("team_id") or (payload.get("team") or {}).get("id") or ""
    channel = event.get("channel") or (payload.get("channel") or {}).get("id") or ""
    return {"team": str(team), "channel": str(channel)}


async def _logged(work: Coroutine[Any, Any, None], what: str) -> None:
    """Run background work a Slack request started; what breaks it (an ephemeral
    refusal Slack would not take, a store outage) is logged, never lost in a task."""
    try:
        await work
    except Exception:
        log.exception("Slack: %s failed", what)


def _form_error(message: str) -> JSONResponse:
    """Slack's answer to a submission that shows ``message`` under the form's field."""
    return JSONResponse({"response_action": "errors", "errors": {FORM_BLOCK: message[:300]}})


#: A button click or a submitted form, told apart by ``type``.
_INTERACTION: TypeAdapter[BlockActions | ViewSubmission] = TypeAdapter(
    Annotated[BlockActions | ViewSubmission, Field(discriminator="type")]
)
#: The event types that start turns, whose shape ``MessageEvent`` checks.
_TURN_EVENTS = ("app_mention", "message")
#: Longest timestamp header read: seconds since the epoch have 10 digits until 2286.
_MAX_TIMESTAMP_DIGITS = 12


def _header_problem(timestamp: str, signature: str) -> str | None:
    """What makes Slack's signature headers unusable, before any is verified."""
    if not timestamp or not signature:
        return "a signature header is missing"
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > _MAX_TIMESTAMP_DIGITS:
        return "the timestamp header is not a number of seconds"
    if not (signature.isascii() and signature.isprintable()):
        return "the signature header is not printable ASCII"
    return None


def _malformed(request: Request, exc: ValidationError) -> Response:
    """A signed request whose payload does not have the shape Slack gives it: 400,
    naming the first field that was wrong, and nothing stored."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the payload"
    log.warning(
        "Slack: refused a malformed payload at %s: %s: %s", request.url.path, where, first["msg"]
    )
    return JSONResponse(
        {"error": f"the payload is not one Slack sends: {where}: {first['msg']}"}, status_code=400
    )


def _unauthorized() -> Response:
    return JSONResponse({"error": "the request is not signed by Slack"}, status_code=401)


def slack_channel(
    *,
    signing_secret: str,
    bot_token: str,
    replace_in_flight: bool = False,
    base_url: str = "https://slack.com/api/",
    update_interval: float = 1.0,
    authorize: Authorize | None = None,
) -> SlackChannel:
    """A Slack channel for one Slack app: its signing secret verifies every request,
    its bot token posts the replies (through slack_sdk's ``AsyncWebClient``, which
    retries rate limits after ``Retry-After`` and dropped connections).
    ``replace_in_flight`` cancels a thread's unfinished turn when a newer message
    arrives in it; that reply ends "superseded by a newer message".
    ``update_interval`` spaces the streamed edits of all the replies in one Slack
    channel (Slack changes about one message per second per channel). ``authorize``
    (as for ``create_app``; the principal is the Slack user id, with the team and
    channel as claims) decides who may start turns and answer questions naming
    nobody; without it, whoever can write in the thread may."""
    for name, value in (("signing_secret", signing_secret), ("bot_token", bot_token)):
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"slack_channel needs {name}, a non-empty str")
    client = AsyncWebClient(
        token=bot_token,
        base_url=base_url,
        retry_handlers=[
            AsyncRateLimitErrorRetryHandler(max_retry_count=3),
            AsyncConnectionErrorRetryHandler(max_retry_count=2),
        ],
    )
    return SlackChannel(
        signing_secret=signing_secret,
        client=client,
        replace_in_flight=replace_in_flight,
        update_interval=update_interval,
        authorize=authorize,
    )
