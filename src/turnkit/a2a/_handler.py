"""The A2A request handler: each A2A method on turnkit's own durable turns.

There is no task store beside the session store: a task is a turn, read from the
store on every call, so any node of a deployment answers for any task, and a task
outlives the process that started it. Every call reaches the runtime through the
HTTP surface's ``FrontendHost`` (``authorize`` for the session, the body checks,
``/resume``'s answer path), so A2A grants nothing the app's own endpoints do not.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import RequestHandler
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from .._access.authorize import Action
from .._access.principal import Principal
from .._errors import SessionBusyError, StoreError, TurnError
from .._runtime.observe import TurnStream
from .._values.records import TurnRecord
from ..server.frontend import (
    EventFeed,
    Followed,
    FrontendHost,
    HttpError,
    Story,
    Target,
    followed,
    identifier,
)
from ._events import Updates
from ._tasks import (
    STATES,
    TERMINAL,
    answers_in,
    max_context_length,
    message_text,
    session_of,
    task_id_for,
    task_of,
)

log = logging.getLogger("turnkit.a2a")

#: Keys of a call context's state under which the endpoint leaves the caller.
PRINCIPAL_KEY = "turnkit.principal"
AGENT_KEY = "turnkit.agent"

Event = Task | Message | TaskStatusUpdateEvent | TaskArtifactUpdateEvent


@dataclass(frozen=True)
class _Opened:
    """A message taken: the task it went to, and its events from then on (``None``
    when there is nothing to follow: the task had already settled, or the caller
    may answer it but not read it)."""

    target: Target
    task_id: str
    stream: TurnStream | None


class TurnTasks(RequestHandler):
    """A2A's methods over one app's agents (the agent comes with each call)."""

    def __init__(self, host: FrontendHost, *, cancel_wait: float) -> None:
        self.host = host
        self.cancel_wait = cancel_wait

    # -- messages ----------------------------------------------------------------

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        async with _translated(params.message.task_id or None):
            opened = await self._open(context, params.message)
            if opened.stream is not None:
                if params.configuration.return_immediately:
                    await opened.stream.aclose()
                else:
                    await _drain(opened.stream)
            record = await opened.target.store.turn(opened.task_id)
            if record is None or not opened.target.allowed:
                # A named answerer who may not read the session: the answer was taken.
                return Task(id=opened.task_id, context_id=opened.target.session_id)
            length = (
                params.configuration.history_length
                if params.configuration.HasField("history_length")
                else None
            )
            return task_of(record, history_length=length)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        async with _translated(params.message.task_id or None):
            opened = await self._open(context, params.message)
            record = await opened.target.store.turn(opened.task_id)
        if record is None or not opened.target.allowed:
            if opened.stream is not None:
                await opened.stream.aclose()
            yield Task(id=opened.task_id, context_id=opened.target.session_id)
            return
        yield task_of(record)
        if opened.stream is None:
            return
        async for event in self._told(opened.stream, record, joined_late=False):
            yield event

    async def _open(self, context: ServerCallContext, message: Message) -> _Opened:
        principal, agent = _caller(context)
        if not message.message_id:
            raise InvalidParamsError("the message needs a messageId")
        if message.task_id:
            return await self._answer(principal, agent, message)
        session_id = message.context_id or uuid.uuid4().hex
        if len(session_id) > max_context_length():
            raise InvalidParamsError(f"contextId is longer than {max_context_length()} characters")
        session_id = identifier(session_id, "contextId")
        text = message_text(message)
        target = await self.host.target(principal, agent, session_id, "turn", refuse=True)
        turn_id = task_id_for(session_id, principal.id, message.message_id)
        session, turn_id = await self.host.start_turn(principal, target, text, turn_id=turn_id)
        stream = session.observe(turn_id)
        # A message sent again finds its turn, which may have settled already.
        record = await target.store.turn(turn_id)
        if record is not None and record.status not in ("queued", "running"):
            await stream.aclose()
            return _Opened(target, turn_id, None)
        return _Opened(target, turn_id, stream)

    async def _answer(self, principal: Principal, agent: str, message: Message) -> _Opened:
        """A message on a task: the answer(s) to the questions it is parked on, each
        given exactly as ``/resume`` gives one."""
        task_id = message.task_id
        session_id = session_of(task_id)
        if message.context_id and message.context_id != session_id:
            raise InvalidParamsError(f"task {task_id!r} is not of context {message.context_id!r}")
        target = await self.host.target(principal, agent, session_id, "resume", refuse=False)
        record = await target.store.turn(task_id) if target.exists else None
        if record is None:
            raise TaskNotFoundError(f"no task {task_id!r}")
        if record.status != "suspended":
            if not target.allowed:
                raise TaskNotFoundError(f"no task {task_id!r}")
            raise UnsupportedOperationError(_not_waiting(record))
        pending = [q for q in await self.host.pending(target) if q.turn_id == task_id]
        try:
            answers = answers_in(message, pending)
        except A2AError:
            if not target.allowed:
                raise TaskNotFoundError(f"no task {task_id!r}") from None
            raise
        stream: TurnStream | None = None
        for input_id, value in answers:
            if stream is not None:
                await stream.aclose()
            stream = await self.host.answer(
                principal,
                target,
                task_id,
                identifier(input_id, "question id"),
                value,
                source="a2a",
            )
        return _Opened(target, task_id, stream)

    # -- tasks -------------------------------------------------------------------

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        async with _translated(params.id):
            _, record = await self._task(context, params.id, "read")
            length = params.history_length if params.HasField("history_length") else None
            return task_of(record, history_length=length)

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        async with _translated(params.id):
            target, record = await self._task(context, params.id, "turn")
            if STATES[record.status] in TERMINAL:
                raise TaskNotCancelableError(
                    f"task {params.id!r} is {record.status} already; it cannot be cancelled"
                )
            # Durable: recorded in the store, so whichever process runs the turn stops
            # it at its next boundary, and no recovery runs it again.
            await self.host.cancel(target)
            deadline = time.monotonic() + self.cancel_wait
            while STATES[record.status] not in TERMINAL and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                record = await target.store.turn(params.id) or record
            return task_of(record)

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        async with _translated(params.id):
            target, record = await self._task(context, params.id, "read")
            # The log first, then the record: the task sent first is at least as new
            # as the events the feed then skips.
            logged = await target.store.events(turn_id=params.id)
            record = await target.store.turn(params.id) or record
            if STATES[record.status] in TERMINAL:
                raise UnsupportedOperationError(
                    f"task {params.id!r} is {record.status}; there is nothing to subscribe to "
                    "(get it instead)"
                )
        yield task_of(record)
        if record.status == "suspended":
            return  # interrupted: the stream ends here, as a send's does
        after = max((e.seq for e in logged if e.seq is not None), default=0)
        feed = self.host.feed(target, turn_id=params.id, after=after)
        async for event in self._told(feed, record, joined_late=True):
            yield event

    async def _task(
        self, context: ServerCallContext, task_id: str, action: Action
    ) -> tuple[Target, TurnRecord]:
        principal, agent = _caller(context)
        session_id = session_of(task_id)
        target = await self.host.target(principal, agent, session_id, action, refuse=True)
        record = await target.store.turn(task_id) if target.exists else None
        if record is None:
            raise TaskNotFoundError(f"no task {task_id!r}")
        return target, record

    async def _told(
        self, source: TurnStream | EventFeed, record: TurnRecord, *, joined_late: bool
    ) -> AsyncIterator[Event]:
        """The turn's events from ``source`` as A2A events, to the end of the turn or
        its park."""
        story = Story(record.turn_id, joined_late=joined_late)
        updates = Updates(record.turn_id, record.session_id)
        error: TurnError | None = None
        async with _translated(record.turn_id):
            followed_events = cast(
                AsyncGenerator[Followed],
                followed(
                    source, idle=self.host.keepalive_seconds, poll=self.host.feed_poll_seconds
                ),
            )
            try:
                async for item in followed_events:
                    if item is None:
                        continue  # the SSE response keeps the connection alive itself
                    if isinstance(item, TurnError):
                        error = item
                        continue
                    for told in story.tell(item):
                        for event in updates.events(told):
                            yield event
            finally:
                await followed_events.aclose()
            for told in story.end(error):
                for event in updates.events(told):
                    yield event

    # -- not served ----------------------------------------------------------------

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        raise UnsupportedOperationError(
            "tasks/list is not served: a context's tasks are its session's turns (see its "
            "transcript on the HTTP surface)"
        )

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


def _caller(context: ServerCallContext) -> tuple[Principal, str]:
    principal = context.state.get(PRINCIPAL_KEY)
    agent = context.state.get(AGENT_KEY)
    if not isinstance(principal, Principal) or not isinstance(agent, str):
        # Only the app's endpoint calls the handler, and it always sets both.
        raise InternalError("the call reached the A2A handler without its caller")
    return principal, agent


def _not_waiting(record: TurnRecord) -> str:
    if STATES[record.status] in TERMINAL:
        return (
            f"task {record.turn_id!r} is {record.status}; a task in a terminal state takes no "
            "more messages (send one without taskId to start another in its context)"
        )
    return f"task {record.turn_id!r} is working; it takes a message only while it asks for input"


async def _drain(stream: TurnStream) -> None:
    """Follow ``stream`` to its end (the turn ended or parked); a broken delivery just
    ends the wait (the task is then read as the store has it)."""
    try:
        async for _ in stream:
            pass
    except TurnError:
        pass
    finally:
        await stream.aclose()


class _translated:
    """The app's refusals and passing troubles as A2A errors, the same words the
    HTTP endpoints answer with; a store's own text stays in the log."""

    def __init__(self, task_id: str | None) -> None:
        self.task_id = task_id

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, A2AError | asyncio.CancelledError | GeneratorExit):
            return
        _raise_translated(exc, self.task_id)


def _raise_translated(exc: BaseException, task_id: str | None) -> NoReturn:
    if isinstance(exc, HttpError):
        if exc.status == 404 and task_id is not None and exc.code == "unknown_session":
            raise TaskNotFoundError(f"no task {task_id!r}") from None
        if exc.status in (400, 404, 413, 422):
            raise InvalidParamsError(exc.message) from None
        if exc.status in (403, 409):
            raise InvalidRequestError(exc.message) from None
        raise InternalError(exc.message) from None
    if isinstance(exc, SessionBusyError):
        raise InternalError(f"the session is busy; try again later ({exc})") from None
    if isinstance(exc, StoreError):
        log.warning("an A2A call failed in the store: %s", exc)
        raise InternalError("the store could not answer; try again later") from None
    if isinstance(exc, TurnError):
        raise InternalError(str(exc)) from None
    log.exception("an A2A call failed", exc_info=exc)
    raise InternalError(f"internal error ({type(exc).__name__}); the server log has more") from None
