"""``Runtime`` and ``AgentSession``: queue turns per session, run them, and report on them.

Turns on one session run one after another in the order they were started; turns
on different sessions run concurrently. Nothing here touches SQL or a model: the
runtime schedules ``TurnRunner``s over the seams it was given.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any

from pydantic_core import from_json, to_json

from .._engine.agent import Agent
from .._engine.context import make_idempotency_key
from .._engine.loop import KnownTranscript, TurnRunner, opening_policy
from .._engine.position import RunTools, next_step
from .._errors import (
    ConfigurationError,
    InvalidAnswerError,
    ResumeConflictError,
    SessionOwnerError,
    SessionSuspendedError,
    TurnCancelledError,
    TurnError,
    TurnFailedError,
    TurnSuspendedError,
)
from .._seams.sink import EventSink, LocalEventSink
from .._seams.store import NO_MESSAGES, SessionStore, Store, Transaction
from .._values.checkpoints import InputAnswer, checkpoint_of
from .._values.events import InputAnsweredEvent, TurnEvent
from .._values.inbound import InboundEvent, Proactive
from .._values.inputs import InputRequest
from .._values.messages import (
    Message,
    OpeningMessage,
    TriggerMessage,
    UserMessage,
    message_from_dict,
)
from .._values.records import TERMINAL_TURN_STATUSES, SessionInfo, SessionStatus, TurnRecord
from .._values.step_ids import input_step_id, policy_step_id, tool_step_id
from .._values.turns import ResetResult, TurnRequest, TurnResult, result_from_record
from .approvals import Grant, GrantSealer, check_answer, check_answerer
from .children import RuntimeChildren, child_session_id
from .observe import TurnStream, event_filter, finished_record, session_events, turn_events

log = logging.getLogger("turnkit.runtime")

#: How many finished turns' in-memory results each session keeps for ``result()``.
_RECENT_RESULTS = 256
#: A transcript position past any session's end: ``load`` then reads no messages.
_PAST_THE_END = 2**31 - 1  # the largest index every store takes (PostgreSQL: integer)


class AgentSession:
    """One conversation with one agent, addressed by ``session_id``."""

    def __init__(self, runtime: Runtime, agent: Agent, store: SessionStore) -> None:
        self.runtime = runtime
        self.agent = agent
        self._store = store
        #: Deliveries in order; ``None`` in place of a request is a reset job.
        self._queue: deque[tuple[TurnRequest | None, asyncio.Future[Any]]] = deque()
        self._current: TurnRequest | None = None
        self._resets_pending = 0
        self._known = KnownTranscript()
        self._futures: OrderedDict[str, asyncio.Future[TurnResult]] = OrderedDict()
        self._worker: asyncio.Task[None] | None = None
        #: The turn this process saw park, so start() can refuse at once; the store
        #: stays the authority (another process may have parked or resumed it).
        self._parked: str | None = None
        #: Deliveries (and later resets) waiting to be queued behind a reset that is
        #: still recording its cancellation; ``None`` when no reset is.
        self._behind_reset: list[tuple[TurnRequest | None, asyncio.Future[Any]]] | None = None

    @property
    def session_id(self) -> str:
        return self._store.session_id

    def delivering(self, turn_id: str) -> bool:
        """Whether this process has the turn queued or running right now."""
        future = self._futures.get(turn_id)
        return future is not None and not future.done()

    # -- starting turns ----------------------------------------------------------

    def start(
        self,
        text: str,
        *,
        event: InboundEvent | None = None,
        trigger: Proactive | None = None,
        replace: bool = False,
        turn_id: str | None = None,
        owner: str | None = None,
    ) -> str:
        """Queue a turn in this process and return its id at once (fire and forget).

        What it promises: the turn runs here, in order after the session's earlier
        turns, and its opening commits when it runs; until then it lives only in
        this process's memory, so a crash before it opens loses it. Use ``submit``
        to have the store hold it before you acknowledge it to anyone. A session
        this process saw park is refused at once (``SessionSuspendedError``); a
        park made elsewhere is found when the turn opens, and the turn then fails
        with nothing stored.

        Passing the ``turn_id`` of an earlier delivery replays that turn from its
        last checkpoint instead of opening a new one (``text`` is then ignored).
        ``replace=True`` first cancels every unfinished turn of the session (reason
        ``replaced``), here and in any other process; the new turn runs once they
        have unwound. It never cancels a parked approval.

        ``owner`` (a principal's id) is whose session this must be: a turn that
        creates the session records it as ``owner``'s, and one on a session with
        another owner (or none) fails with ``SessionOwnerError``, storing nothing.
        ``None``, for code acting on its own, checks and records no owner.
        """
        self._check_start(text, event, trigger, turn_id, owner)
        return self._start(text, event, trigger, replace, turn_id, frozenset(), owner)

    async def submit(
        self,
        text: str,
        *,
        event: InboundEvent | None = None,
        trigger: Proactive | None = None,
        replace: bool = False,
        turn_id: str | None = None,
        owner: str | None = None,
    ) -> str:
        """Queue a turn durably and return its id once the store holds it.

        Unlike ``start``, the turn is recorded as ``queued`` before this returns, so
        a crash from then on loses nothing: this process runs it in order, or
        ``runtime.recover()`` in whichever process restarts. Refusals are read
        from the store, so they hold in every process: ``SessionSuspendedError``
        while the session waits for input, ``ConfigurationError`` for a session of
        another agent, ``SessionOwnerError`` for one ``owner`` did not open (see
        ``start``). ``turn_id`` of a turn the store already has redelivers it.
        """
        self._check_start(text, event, trigger, turn_id, owner)
        if turn_id is not None and await self._store.turn(turn_id) is not None:
            return self._start(text, event, trigger, replace, turn_id, frozenset(), owner)
        if self._known.messages is None or owner is not None:
            # (Without an owner to check, a delivery here has checked the agent.)
            snap = await self._store.load(from_index=NO_MESSAGES)
            if snap.agent is not None and snap.agent != self.agent.name:
                raise ConfigurationError(
                    f"session {self.session_id} belongs to agent {snap.agent!r}, "
                    f"not {self.agent.name!r}"
                )
            if owner is not None and snap.agent is not None and snap.owner != owner:
                raise SessionOwnerError(_owner_refusal(self.session_id, owner))
        parked = await self._store.parked()
        if parked is not None:
            self._parked = parked.turn_id
            raise SessionSuspendedError(_parked_refusal(self.session_id, parked.turn_id))
        request = self._request(text, event, trigger, turn_id, frozenset(), owner, queued=True)
        record = TurnRecord(
            session_id=self.session_id,
            turn_id=request.turn_id,
            agent=self.agent.name,
            status="queued",
            opening=request.opening.to_dict(),
            event=event.to_dict() if event is not None else None,
            created_at=time.time(),
        )
        policy = opening_policy(self.agent, request, event).to_dict()

        def write(tx: Transaction) -> None:
            tx.queue_turn(record, owner=owner)
            tx.put_step(policy_step_id(record.turn_id), record.turn_id, policy)

        await self._store.commit(write)
        if replace:
            self._replace(keep=request.turn_id)
        return self._enqueue(request)

    def _check_start(
        self, text: object, event: object, trigger: object, turn_id: object, owner: object
    ) -> None:
        if not isinstance(text, str):
            raise TypeError(f"turn text must be a str, got {type(text).__name__}")
        if event is not None and not isinstance(event, InboundEvent):
            raise TypeError(f"event must be an InboundEvent, got {type(event).__name__}")
        if trigger is not None and not isinstance(trigger, Proactive):
            raise TypeError(f"trigger must be a Proactive, got {type(trigger).__name__}")
        if event is not None and trigger is not None:
            raise ConfigurationError("a turn has either an inbound event or a trigger, not both")
        if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
            raise ConfigurationError("turn_id must be a non-empty string")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise ConfigurationError(f"owner must be a non-empty str or None, got {owner!r}")

    def open_child_turn(
        self, task: str, trigger: Proactive, turn_id: str, deny: frozenset[str]
    ) -> str:
        """Open (or redeliver) turn ``turn_id`` as a child of another turn's tool call:
        ``trigger`` names the parent agent and ``deny`` carries the parent's denied
        tools. ``turnkit.subagent`` runs child turns through this."""
        return self._start(task, None, trigger, False, turn_id, deny, None)

    def _start(
        self,
        text: str,
        event: InboundEvent | None,
        trigger: Proactive | None,
        replace: bool,
        turn_id: str | None,
        deny: frozenset[str],
        owner: str | None,
    ) -> str:
        """``start`` after its checks; ``deny`` adds tools a new turn may not use (a
        subagent's child inherits its parent's denials)."""
        if self._parked is not None and turn_id != self._parked:
            raise SessionSuspendedError(_parked_refusal(self.session_id, self._parked))
        request = self._request(text, event, trigger, turn_id, deny, owner, queued=False)
        if replace:
            self._replace(keep=request.turn_id)
        return self._enqueue(request)

    @staticmethod
    def _request(
        text: str,
        event: InboundEvent | None,
        trigger: Proactive | None,
        turn_id: str | None,
        deny: frozenset[str],
        owner: str | None,
        *,
        queued: bool,
    ) -> TurnRequest:
        tid = turn_id or uuid.uuid4().hex
        opening: OpeningMessage = (
            TriggerMessage(text=text, turn_id=tid, by=trigger.by)
            if trigger is not None
            else UserMessage(text=text, turn_id=tid)
        )
        source = trigger.source if trigger is not None else None
        return TurnRequest(
            turn_id=tid,
            opening=opening,
            event=event,
            source=source,
            inherited_deny=deny,
            owner=owner,
            queued=queued,
        )

    def _replace(self, *, keep: str) -> None:
        """Cancel the session's other unfinished turns (reason ``replaced``): the ones
        here at once, and, recorded in the store, those running in any other process
        (they stop at their next boundary). Never ``keep``, never a parked approval."""
        self._signal_all("replaced", keep=keep)
        self.runtime.spawn(self._record_cancel_quietly("replaced", keep=keep))

    def _enqueue(self, request: TurnRequest, *, ahead: bool = False) -> str:
        """Queue a delivery. While a reset is recording its cancellation, new turns
        wait to be queued behind it; ``ahead`` (a cancelled park being closed) goes
        straight in, before the reset."""
        tid = request.turn_id
        pending = self._futures.get(tid)
        if pending is not None and not pending.done():
            return tid  # already queued or running here: one delivery is enough
        loop = self.runtime._require_loop()
        future: asyncio.Future[TurnResult] = loop.create_future()
        future.add_done_callback(_mark_exception_seen)
        self._remember(tid, future)
        if self._behind_reset is not None and not ahead:
            self._behind_reset.append((request, future))  # queued once the reset is
        else:
            self._queue.append((request, future))
            self._ensure_worker()
        return tid

    def _ensure_worker(self) -> None:
        if self._worker is None:
            loop = self.runtime._require_loop()
            self._worker = loop.create_task(self._drain(), name=f"turnkit:{self.session_id}")
            self.runtime._busy[self.session_id] = self

    @property
    def idle(self) -> bool:
        """Whether nothing of this session is queued, running or being reset here, and
        nobody waits here for a turn's result: the runtime may then drop this object
        (the store keeps everything; a later ``runtime.session`` makes a new one)."""
        return (
            self._worker is None
            and not self._queue
            and not self._resets_pending
            and self._behind_reset is None
            and all(f.done() for f in self._futures.values())
        )

    async def turn(
        self,
        text: str,
        *,
        event: InboundEvent | None = None,
        trigger: Proactive | None = None,
        replace: bool = False,
        turn_id: str | None = None,
        owner: str | None = None,
    ) -> str:
        """Submit a turn (durably, see ``submit``) and wait for its answer; raise
        ``TurnFailedError`` if it fails, ``TurnSuspendedError`` (carrying the request)
        if it parks for input and ``TurnCancelledError`` if it is cancelled."""
        tid = await self.submit(
            text, event=event, trigger=trigger, replace=replace, turn_id=turn_id, owner=owner
        )
        result = await self.result(tid)
        if result.status == "suspended" and result.request is not None:
            raise TurnSuspendedError(result.turn_id, result.request)
        if result.status == "cancelled":
            raise TurnCancelledError(result.turn_id, result.reason or "requested")
        if result.status != "completed":
            raise TurnFailedError(result.turn_id, result.error or result.status)
        return result.text or ""

    # -- human in the loop ---------------------------------------------------------

    async def turn_record(self, turn_id: str) -> TurnRecord | None:
        """What the store holds about turn ``turn_id`` of this session, if anything."""
        return await self._store.turn(turn_id)

    async def pending(self) -> InputRequest | None:
        """The input request this session is parked on, or ``None``."""
        parked = await self._parked_input()
        return parked[0] if parked is not None else None

    async def _parked_input(self) -> tuple[InputRequest, int] | None:
        """The request this session is parked on and the generation it waits in."""
        record = await self._store.parked()
        checkpoint = checkpoint_of(record) if record is not None else None
        if checkpoint is None:
            return None
        return checkpoint.request, checkpoint.generation

    async def resume(
        self,
        turn_id: str,
        input_id: str,
        value: Any,
        *,
        by: str | None = None,
        granted: Grant | None = None,
    ) -> str:
        """Answer the parked turn's request and replay it; return the turn id.

        ``by`` is the answerer's verified identity (never what a user typed);
        ``granted`` is a ``Grant`` from ``grant_answer`` for a policy answerer.
        Raises ``ResumeConflictError`` (wrong turn, wrong input id, session not
        parked), ``ResumeAuthorizationError`` (not an admitted answerer) or
        ``InvalidAnswerError`` (the answer breaks the request's schema); none of
        them stores anything. ``await session.result(turn_id)`` waits for the
        replayed turn.
        """
        if self._resets_pending:
            raise ResumeConflictError(
                f"session {self.session_id} has a reset pending; its parked turn is being "
                "archived, so it can no longer be resumed"
            )
        async with self._store.writer():
            record = await self._store.parked()
            checkpoint = checkpoint_of(record) if record is not None else None
            if record is None or checkpoint is None:
                raise ResumeConflictError(
                    f"session {self.session_id} is not waiting for input (turn {turn_id})"
                )
            if record.turn_id != turn_id:
                raise ResumeConflictError(
                    f"session {self.session_id} waits on turn {record.turn_id}, not {turn_id}"
                )
            request = checkpoint.request
            if request.id != input_id:
                raise ResumeConflictError(
                    f"turn {turn_id} waits for input {request.id!r}, not {input_id!r}"
                )
            check_answerer(
                request,
                session_id=self.session_id,
                generation=checkpoint.generation,
                by=by,
                granted=granted,
                sealer=self.runtime._grants,
            )
            try:
                encoded = to_json(value)
            except ValueError as exc:
                raise InvalidAnswerError(
                    f"the answer to input {input_id!r} is not JSON: {exc}"
                ) from None
            try:
                check_answer(request, value)
            except ValueError as exc:
                raise InvalidAnswerError(str(exc)) from None

            # Who answered is logged with the answer, in the same transaction: once,
            # however often the resumed turn is redelivered after a crash.
            answered = InputAnsweredEvent(
                turn_id=turn_id,
                session_id=self.session_id,
                input_id=input_id,
                call_id=request.call_id,
                by=by,
                value=from_json(encoded),  # observers get a copy of their own
                seq=(await self._store.load(turn_id, from_index=NO_MESSAGES)).next_seq,
            )

            answer = InputAnswer(value=value, by=by)

            def write(tx: Transaction) -> None:
                tx.put_step(input_step_id(turn_id, input_id), turn_id, answer.to_dict())
                tx.set_turn_status(turn_id, "running")
                tx.log_event(answered)

            await self._store.commit(write)
        self._parked = None
        opening = message_from_dict(record.opening)
        event = InboundEvent.from_dict(record.event) if record.event else None
        if not isinstance(opening, UserMessage | TriggerMessage):
            raise TurnError(f"turn {turn_id} has no opening message to replay")
        return self._enqueue(
            TurnRequest(
                turn_id=turn_id,
                opening=opening,
                event=event,
                policy=checkpoint.policy,
                announce=(answered,),
            )
        )

    def _remember(self, turn_id: str, future: asyncio.Future[TurnResult]) -> None:
        self._futures[turn_id] = future
        self._futures.move_to_end(turn_id)
        while len(self._futures) > _RECENT_RESULTS:
            oldest, fut = next(iter(self._futures.items()))
            if not fut.done():
                break
            del self._futures[oldest]

    async def _drain(self) -> None:
        try:
            while self._queue:
                request, future = self._queue.popleft()
                if request is None:
                    await self._run_reset(future)
                else:
                    self._current = request
                    try:
                        await self._deliver(request, future)
                    finally:
                        self._current = None
        finally:
            self._worker = None
            if self.runtime._busy.get(self.session_id) is self:
                del self.runtime._busy[self.session_id]
            while self._queue:
                request, future = self._queue.popleft()
                what = f"turn {request.turn_id}" if request is not None else "the reset"
                _settle(
                    future,
                    TurnError(
                        f"the runtime closed before {what} started; it was never stored, "
                        "so ask again"
                    ),
                )

    async def _deliver(self, request: TurnRequest, future: asyncio.Future[TurnResult]) -> None:
        # Let observers that were set up right after start() subscribe before we run:
        # with a local store a whole turn can otherwise finish without yielding once.
        await asyncio.sleep(0)
        for event in request.announce:
            _emit_quietly(self.runtime.sink, event)
        runner = TurnRunner(
            agent=self.agent,
            store=self._store,
            sink=self.runtime.sink,
            request=request,
            children=self.runtime.children,
            known=self._known,
        )
        try:
            result = await runner.run()
            self._known.messages = runner.transcript
            self._known.generation = runner.generation
            final = result.status in ("completed", "cancelled")
            self._known.finished = request.turn_id if final else None
            if result.status == "suspended":
                self._parked = request.turn_id
            future.set_result(result)
        except Exception as exc:
            self._known.forget()  # read it all again next time, to be safe
            log.exception("turn %s on session %s crashed", request.turn_id, self.session_id)
            future.set_exception(exc)
        except BaseException as exc:
            interrupted = TurnError(
                f"turn {request.turn_id} was interrupted ({type(exc).__name__}); it is still "
                "open in the store: redeliver it or call runtime.recover()"
            )
            interrupted.__cause__ = exc
            self._known.forget()
            _settle(future, interrupted)
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise

    # -- cancellation and reset -------------------------------------------------

    def _signal_all(self, reason: str, *, keep: str | None = None) -> list[str]:
        """Tell the running delivery and every queued one (but ``keep``) to stop at
        their next checkpoint boundary; return their turn ids."""
        signalled: list[str] = []
        requests = [self._current] + [r for r, _ in self._queue]
        for request in requests:
            if request is not None and request.turn_id != keep:
                request.cancel.cancel(reason)
                signalled.append(request.turn_id)
        return signalled

    async def _record_cancel(self, reason: str, *, keep: str | None = None) -> list[str]:
        """Record the cancellation in the store for the session's unfinished turns, so
        a crash before their next boundary cannot bring them back and a process
        running one sees it; a parked turn is ended at once (there is no delivery to
        reach a boundary). ``keep`` (a replace) spares that turn and parked ones."""
        recorded: list[str] = []
        for record in await self._store.unfinished():
            if keep is not None and (record.turn_id == keep or record.status == "suspended"):
                continue
            recorded.append(record.turn_id)
            if record.cancel_reason is None:
                await self._store.commit(_cancel_request(record.turn_id, reason))
            if record.status == "suspended":
                self._parked = None
                opening = message_from_dict(record.opening)
                if isinstance(opening, UserMessage | TriggerMessage):
                    request = TurnRequest(turn_id=record.turn_id, opening=opening)
                    request.cancel.cancel(reason)
                    self._enqueue(request, ahead=True)
        return recorded

    async def _record_cancel_quietly(self, reason: str, keep: str) -> None:
        try:
            await self._record_cancel(reason, keep=keep)
        except Exception as exc:
            # The in-memory signal still stops the turns; only crash-durability is lost.
            log.warning(
                "recording the %s cancellation on %s failed: %s", reason, self.session_id, exc
            )

    async def cancel(self, reason: str = "requested") -> list[str]:
        """Cancel every unfinished turn of the session, running, queued or parked.

        Each stops at its next checkpoint boundary (before its opening commits,
        before a model call, between model deltas, between tool calls); what
        committed stays. The cancellation is recorded in the store first, so a
        turn cancelled before a crash is not run again by a replay or
        ``runtime.recover()``. Returns the ids of the turns it reached; their
        results then say ``status == "cancelled"`` with ``reason``.
        """
        if not isinstance(reason, str) or not reason:
            raise ConfigurationError(f"cancel reason must be a non-empty str, got {reason!r}")
        signalled = self._signal_all(reason)
        children = await self._unfinished_children()  # before the parent's calls close
        recorded = await self._record_cancel(reason)
        for child in children:
            await child.cancel(reason)  # and its own children, in turn
        return list(dict.fromkeys(signalled + recorded))

    async def _unfinished_children(self) -> list[AgentSession]:
        """The sessions of child turns (``turnkit.subagent``) that this session's
        unfinished turns are waiting on and that have not ended, wherever they run.

        A child's session and turn ids derive from the parent call's idempotency
        key, so they are found from the calls the parent still owes a result."""
        unfinished = await self._store.unfinished()
        if not unfinished:
            return []
        snap = await self._store.load(from_index=NO_MESSAGES)
        transcript = await self._store.messages()
        found: list[AgentSession] = []
        for record in unfinished:
            step = next_step(transcript, record.turn_id)
            if not isinstance(step, RunTools):
                continue
            for call in step.owed:
                key = make_idempotency_key(
                    store_id=snap.store_id,
                    session_id=self.session_id,
                    generation=snap.generation,
                    turn_id=record.turn_id,
                    step_id=tool_step_id(step.assistant_index, call.id),
                )
                for name in self.runtime.agents:
                    sid = child_session_id(self.session_id, name, key)
                    child_turn = await self.runtime.store.session(sid).turn(key)
                    if child_turn is not None and child_turn.status not in TERMINAL_TURN_STATUSES:
                        found.append(self.runtime.session(name, sid))
        return found

    async def reset(self) -> ResetResult:
        """Retire the session's history and keep its address.

        Cancels its unfinished turns (reason ``reset``), then, in order after them,
        archives the transcript, steps, events and turns under the current
        generation number and empties the live session (status ``new``) in one
        transaction. New turns may queue behind it; ``resume`` refuses until it
        is done.
        """
        self._resets_pending += 1
        # Turns started from now on queue behind this reset, even those started
        # while its cancellation is still being recorded.
        first = self._behind_reset is None
        if first:
            self._behind_reset = []
        try:
            try:
                self._parked = None  # a stale park is archived with everything else
                await self.cancel("reset")
                future: asyncio.Future[ResetResult] = self.runtime._require_loop().create_future()
                if first:
                    self._queue.append((None, future))
                else:
                    assert self._behind_reset is not None
                    self._behind_reset.append((None, future))  # behind the earlier reset
            finally:
                if first:
                    held, self._behind_reset = self._behind_reset or [], None
                    self._queue.extend(held)
                    if self._queue:
                        self._ensure_worker()
            return await future
        finally:
            self._resets_pending -= 1

    async def _run_reset(self, future: asyncio.Future[Any]) -> None:
        self._known.forget()
        try:
            async with self._store.writer():
                result = await self._archive()
        except Exception as exc:
            _settle(future, exc)
            return
        except BaseException as exc:
            _settle(future, TurnError(f"the reset was interrupted ({type(exc).__name__})"))
            raise
        self._parked = None
        future.set_result(result)

    async def _archive(self) -> ResetResult:
        """Archive the live generation, unless it holds nothing (status ``new``: no
        turn opened since the session began or was last reset), under the writer."""
        generation = (await self._store.load(from_index=_PAST_THE_END)).generation
        if await self._store.status() == "new":
            return ResetResult(
                previous_session=None, archived_generation=None, generation=generation
            )
        # Queued turns the reset cancelled (in any process) end with it; those queued
        # after it began stay live and run in the new generation.
        settle = [
            r for r in await self._store.unfinished() if r.status == "queued" and r.cancel_reason
        ]

        def write(tx: Transaction) -> None:
            for record in settle:
                tx.settle_queued(record.turn_id, "cancelled", reason=record.cancel_reason)
            tx.archive_generation(generation, self.agent.name)

        await self._store.commit(write)
        return ResetResult(
            previous_session=f"{self.session_id}#g{generation}",
            archived_generation=generation,
            generation=generation + 1,
        )

    async def generations(self) -> list[int]:
        """The archived generations of this session (one per reset), oldest first."""
        return await self._store.generations()

    async def archived_messages(self, generation: int) -> list[Message]:
        """The transcript the session had in ``generation`` (``"s1#g0"`` is 0)."""
        return await self._store.archived_messages(generation)

    # -- reading results and state -----------------------------------------------

    async def result(self, turn_id: str) -> TurnResult:
        """Wait for the turn to end here, or read how it ended from the store."""
        future = self._futures.get(turn_id)
        if future is not None:
            return await asyncio.shield(future)
        return result_from_record(await finished_record(self._store, turn_id))

    async def messages(self) -> list[Message]:
        """The live transcript, oldest first."""
        return await self._store.messages()

    async def status(self) -> SessionStatus:
        """``new``, ``running``, ``suspended`` or ``idle``."""
        return await self._store.status()

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        """Structural events logged for the session (or one turn) with ``seq > after``."""
        return await self._store.events(turn_id=turn_id, after=after)

    # -- observing ---------------------------------------------------------------

    def observe(self, turn_id: str, *, replay: bool = False) -> TurnStream:
        """The turn's events as they happen, ending after its terminal event (or its
        ``input.requested``): ``async for event in session.observe(turn_id)``.

        It listens from the moment it is called, before the first iteration. With
        ``replay=True`` the events already logged for the turn come first, so a late
        observer misses nothing structural (live deltas are never replayed).
        """
        return TurnStream(
            sink=self.runtime.sink,
            store=self._store,
            turn_id=turn_id,
            future=self._futures.get(turn_id),
            replay=replay,
        )

    def subscribe(
        self,
        callback: Callable[[TurnEvent], None],
        *,
        turn_id: str | None = None,
        replay: bool = False,
    ) -> Callable[[], None]:
        """Call ``callback`` with this session's events (one turn's, if given).

        Returns the function that unsubscribes. A callback that raises is logged and
        skipped; it never breaks the turn or other subscribers.
        """
        if not replay:
            wanted = event_filter(self.session_id, turn_id)

            def filtered(event: TurnEvent) -> None:
                if wanted(event):
                    callback(event)

            return self.runtime.sink.subscribe(filtered)

        async def forward() -> None:
            try:
                async for event in self._stream(turn_id, replay=True):
                    try:
                        callback(event)
                    except Exception:
                        log.exception("subscriber %r raised on %s; ignored", callback, event.type)
            except Exception as exc:
                log.warning("replaying subscription on session %s ended: %s", self.session_id, exc)

        task = self.runtime.spawn(forward())

        def unsubscribe() -> None:
            task.cancel()

        return unsubscribe

    async def _stream(self, turn_id: str | None, *, replay: bool) -> AsyncIterator[TurnEvent]:
        queue: asyncio.Queue[TurnEvent] = asyncio.Queue()
        wanted = event_filter(self.session_id, turn_id)

        def enqueue(event: TurnEvent) -> None:
            if wanted(event):
                queue.put_nowait(event)

        # Subscribe before reading the log, so nothing falls between the two.
        unsubscribe = self.runtime.sink.subscribe(enqueue)
        try:
            if turn_id is None:
                events = session_events(self._store, queue, replay=replay)
            else:
                future = self._futures.get(turn_id)
                events = turn_events(self._store, queue, turn_id, future, replay=replay)
            async for event in events:
                yield event
        finally:
            unsubscribe()


def _owner_refusal(session_id: str, owner: str) -> str:
    return (
        f"session {session_id} was not opened by {owner!r}; a turn for one "
        "owner cannot run in a session another owner (or code) opened"
    )


def _parked_refusal(session_id: str, turn_id: str) -> str:
    return (
        f"session {session_id} is waiting for input on turn {turn_id}; "
        "resume it (or reset the session) before starting another turn"
    )


def _cancel_request(turn_id: str, reason: str) -> Callable[[Transaction], None]:
    def write(tx: Transaction) -> None:
        tx.request_cancel(turn_id, reason)

    return write


def _emit_quietly(sink: EventSink, event: TurnEvent) -> None:
    """Tell observers ``event``; a sink that raises is logged, never the turn's problem."""
    try:
        sink.emit(event)
    except Exception:
        log.exception("event sink raised on %s; ignored", event.type)


def _settle(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _mark_exception_seen(future: asyncio.Future[TurnResult]) -> None:
    """Mark a failed turn's exception as seen: it is logged already, and a caller
    that never awaits ``result()`` should not get an asyncio warning for it."""
    if not future.cancelled():
        future.exception()


class Runtime:
    """Runs agents' turns over one store and one event sink. Use it with ``async with``.

    ``recover()`` replays the turns a dead process left unfinished; call it at
    startup so a crash needs no caller to redeliver.
    """

    def __init__(
        self,
        agents: Agent | Sequence[Agent],
        *,
        store: Store,
        sink: EventSink | None = None,
        session_cache: int = 1000,
    ) -> None:
        listed = [agents] if isinstance(agents, Agent) else list(agents)
        self.agents: dict[str, Agent] = {}
        for agent in listed:
            if not isinstance(agent, Agent):
                raise ConfigurationError(f"Runtime agents must be Agent objects, got {agent!r}")
            if agent.name in self.agents:
                raise ConfigurationError(f"two agents are named {agent.name!r}")
            self.agents[agent.name] = agent
        if not isinstance(store, Store):
            raise ConfigurationError(
                f"store must implement turnkit.stores.Store (MemoryStore, SqliteStore, …), "
                f"got {type(store).__name__}"
            )
        if sink is not None and not isinstance(sink, EventSink):
            raise ConfigurationError(
                "sink must implement turnkit.EventSink (emit, subscribe), "
                f"got {type(sink).__name__}"
            )
        self.store = store
        self.sink: EventSink = sink if sink is not None else LocalEventSink()
        # Seals the grants grant_answer issues; its key never leaves this process, and
        # it is no public attribute: a grant is made by grant_answer, never by hand.
        self._grants = GrantSealer()
        if isinstance(session_cache, bool) or not isinstance(session_cache, int):
            raise ConfigurationError(f"session_cache must be an int, got {session_cache!r}")
        if session_cache < 0:
            raise ConfigurationError(f"session_cache must be 0 or more, got {session_cache}")
        #: How many idle session objects this runtime keeps (least recently used go
        #: first); busy ones are always kept. Memory is a cache: the store has it all.
        self.session_cache = session_cache
        self._sessions: OrderedDict[str, AgentSession] = OrderedDict()
        #: Sessions with a worker running here, cached or not (see AgentSession.idle).
        self._busy: dict[str, AgentSession] = {}
        self.children = RuntimeChildren(self, self._grants)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Runtime:
        await self.store.open()
        self._loop = asyncio.get_running_loop()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Wait for queued turns to finish (or, on an error, cancel them), then close."""
        # (A worker cancelled before it ever ran never reaches its ``finally``: done
        # tasks are skipped, so closing cannot spin on one.)
        while workers := [
            s._worker for s in self._busy.values() if s._worker is not None and not s._worker.done()
        ]:
            if exc_type is not None:
                for task in workers:
                    task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._loop = None
        await self.store.close()

    @property
    def is_open(self) -> bool:
        """Whether the runtime is inside its ``async with`` (turns can run)."""
        return self._loop is not None

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise ConfigurationError("the Runtime is not open: use `async with Runtime(...)`")
        return self._loop

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a helper task that the runtime cancels when it closes."""
        task = self._require_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def cached_sessions(self) -> int:
        """How many session objects this runtime holds right now (for monitoring)."""
        return len(self._sessions)

    def session(self, agent_name: str, session_id: str) -> AgentSession:
        """The session ``session_id`` of agent ``agent_name``: the same object each
        time while it is busy or among the ``session_cache`` most recently used."""
        agent = self.agents.get(agent_name)
        if agent is None:
            raise ConfigurationError(
                f"unknown agent {agent_name!r}; this runtime has {sorted(self.agents)}"
            )
        if not isinstance(session_id, str) or not session_id:
            raise ConfigurationError("session_id must be a non-empty string")
        existing = self._sessions.get(session_id) or self._busy.get(session_id)
        if existing is not None:
            if existing.agent.name != agent_name:
                raise ConfigurationError(
                    f"session {session_id!r} belongs to agent {existing.agent.name!r}"
                )
            self._sessions[session_id] = existing
            self._sessions.move_to_end(session_id)
            return existing
        session = AgentSession(self, agent, self.store.session(session_id))
        self._sessions[session_id] = session
        self._trim()
        return session

    def _trim(self) -> None:
        """Drop the least recently used idle sessions beyond ``session_cache``."""
        excess = len(self._sessions) - self.session_cache
        if excess <= 0:
            return
        drop: list[str] = []
        for sid, session in self._sessions.items():  # oldest first; usually the first
            if session.idle:
                drop.append(sid)
                if len(drop) == excess:
                    break
        for sid in drop:
            del self._sessions[sid]

    async def sessions(self) -> list[SessionInfo]:
        """Every session the store holds, with its agent and status."""
        return await self.store.sessions()

    async def recover(self) -> list[TurnResult]:
        """Replay every turn left unfinished in the store and wait for them to end.

        Returns the results of the deliveries that ran to an end; one that cannot
        run (its agent is missing, the store fails again) is logged and skipped, so
        it never keeps the others from recovering.
        """
        self._require_loop()
        waits = []
        for record in await self.store.unfinished_turns():
            try:
                session = self.session(record.agent, record.session_id)
            except ConfigurationError as exc:
                log.warning("cannot recover turn %s: %s", record.turn_id, exc)
                continue
            turn_id = session.start(str(record.opening.get("text", "")), turn_id=record.turn_id)
            waits.append(session.result(turn_id))
        results: list[TurnResult] = []
        for outcome in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(outcome, TurnResult):
                results.append(outcome)
            else:
                log.warning("recovering a turn failed again: %s", outcome)
        return results
