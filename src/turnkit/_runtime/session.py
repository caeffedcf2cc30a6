"""``AgentSession``: one session's queue of turns and its reset barrier.

Turns on one session run one after another in the order they were started; a
reset cancels what is unfinished and archives behind it. Reading and observing
come from ``SessionView``, checking an answer from ``resuming``. Nothing here
touches SQL or a model: it schedules ``TurnRunner``s over the seams it was given.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Protocol, TypeVar, Unpack

from .._engine.agent import Agent
from .._engine.context import make_idempotency_key
from .._engine.loop import KnownTranscript, TurnRunner, opening_policy
from .._engine.position import RunTools, next_step
from .._engine.rate_waits import RateLimiter
from .._engine.reset import carry_out_reset
from .._errors import (
    ConfigurationError,
    FencedError,
    ResumeConflictError,
    SessionOwnerError,
    SessionSuspendedError,
    StoreError,
    TurnCancelledError,
    TurnError,
    TurnFailedError,
    TurnHeldError,
    TurnSuspendedError,
)
from .._seams.placing import PlacingStore
from .._seams.sink import EventSink
from .._seams.store import NO_MESSAGES, SessionStore, Store, parked_turn
from .._seams.tracer import Tracer
from .._values.budgets import Budget
from .._values.events import TurnEvent
from .._values.inbound import Proactive
from .._values.messages import (
    OpeningMessage,
    TriggerMessage,
    UserMessage,
)
from .._values.records import TERMINAL_TURN_STATUSES, TurnRecord
from .._values.step_ids import policy_step_id, tool_step_id
from .._values.text import unstorable
from .._values.turn_options import TurnKeywords, TurnOptions, turn_options
from .._values.turn_rules import new_turn
from .._values.turns import ResetResult, TurnRequest, TurnResult
from .._values.writes import EraseSession, PutStep, RequestCancel, RequestReset
from .approvals import Grant, GrantSealer
from .children import RuntimeChildren, child_session_id
from .clock import settle_due
from .forking import fork_session
from .resuming import record_answer, replay_request
from .session_queue import DeliverJob, Erase, ResetJob, SessionQueue
from .session_view import SessionView, ViewHost

log = logging.getLogger("turnkit.runtime")

_T = TypeVar("_T")


class SessionHost(ViewHost, Protocol):
    """What a session needs of its runtime (``Runtime`` is one)."""

    @property
    def agents(self) -> dict[str, Agent]: ...

    @property
    def store(self) -> Store: ...

    @property
    def children(self) -> RuntimeChildren: ...

    @property
    def tracer(self) -> Tracer: ...

    @property
    def claims_turns(self) -> bool: ...

    def running_loop(self) -> asyncio.AbstractEventLoop: ...

    def mark_busy(self, session: AgentSession) -> None:
        """Keep ``session`` while it has a delivery running here."""

    def mark_idle(self, session: AgentSession) -> None:
        """``session`` has nothing running here any more."""

    def tenant_gate(self, tenant: str) -> asyncio.Semaphore | None: ...

    @property
    def budget(self) -> Budget | None: ...

    @property
    def rates(self) -> RateLimiter | None: ...

    def session(self, agent_name: str, session_id: str) -> AgentSession: ...

    def note_fenced(self) -> None:
        """Count a delivery stopped because another process took its turn over."""


#: How many finished turns' in-memory results each session keeps for ``result()``.
_RECENT_RESULTS = 256


class AgentSession(SessionView):
    """One conversation with one agent, addressed by ``session_id``."""

    runtime: SessionHost

    def __init__(
        self, runtime: SessionHost, agent: Agent, store: SessionStore, grants: GrantSealer
    ) -> None:
        self.runtime = runtime
        self.agent = agent
        self._store = store
        # Checks the grants resume is given (and grant_answer seals them); the
        # runtime's own, never a public attribute.
        self._grants = grants
        self._queue = SessionQueue()
        self._resets_pending = 0
        self._known = KnownTranscript()
        self._futures: OrderedDict[str, asyncio.Future[TurnResult]] = OrderedDict()
        self._handed: OrderedDict[str, int | None] = OrderedDict()
        self._worker: asyncio.Task[None] | None = None
        #: The turn this process saw park, so start() can refuse at once; the store
        #: stays the authority (another process may have parked or resumed it).
        self._parked: str | None = None
        #: Submits of this session in this process, one at a time in call order
        #: (asyncio's lock is first come, first served): the order of the calls is
        #: the order of acknowledgement is the order in the store's queue.
        self._submitting = asyncio.Lock()

    def delivering(self, turn_id: str) -> bool:
        """Whether this process has the turn queued or running right now."""
        future = self._futures.get(turn_id)
        return future is not None and not future.done()

    # -- starting turns ----------------------------------------------------------

    def start(
        self,
        text: str,
        options: TurnOptions | None = None,
        /,
        **keywords: Unpack[TurnKeywords],
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

        ``tenant`` is whose turn it is (docs/tenants.md): its fair share of workers,
        its concurrency cap and its budget are the tenant's. ``None``: the default
        tenant ``""``. The options come as one ``TurnOptions`` or as its fields'
        keywords (``TurnKeywords``).
        """
        return self._start(_text(text), turn_options(options, keywords))

    async def submit(
        self,
        text: str,
        options: TurnOptions | None = None,
        /,
        **keywords: Unpack[TurnKeywords],
    ) -> str:
        """Queue a turn durably and return its id once the store holds it.

        Unlike ``start``, the turn is recorded as ``queued`` before this returns, so
        a crash from then on loses nothing: this process runs it in order, or
        ``runtime.recover()`` in whichever process restarts. Refusals are read
        from the store, so they hold in every process: ``SessionSuspendedError``
        while the session waits for input, ``ConfigurationError`` for a session of
        another agent, ``SessionOwnerError`` for one ``owner`` did not open (see
        ``start``). Sending the ``turn_id`` of a turn the store already has is a
        retry: it stores nothing and returns the id, so the caller follows the turn
        already there, as it was stored (this process delivers it again if it runs
        turns and the turn is not delivering here). Concurrent calls are
        acknowledged, stored and run in the order they were made. ``tenant``: see
        ``start``; a retry keeps the tenant the turn was stored with.
        """
        opts = turn_options(options, keywords)
        text = _text(text)
        turn_id = opts.turn_id
        async with self._submitting:
            if turn_id is not None and (stored := await self._store.turn(turn_id)) is not None:
                return self._resent(stored, text, opts)
            try:
                return await self._submit_new(text, opts)
            except StoreError:
                # Another process may have stored the same id since it was looked up:
                # then this is a retry that raced its original, not a failure.
                if turn_id is None or (stored := await self._store.turn(turn_id)) is None:
                    raise
                return self._resent(stored, text, opts)

    def _resent(self, stored: TurnRecord, text: str, opts: TurnOptions) -> str:
        """A turn id the store has, sent again: follow that turn (see ``submit``);
        its stored opening is the turn's, whatever ``text`` says now."""
        if not self.runtime.run_turns or self.delivering(stored.turn_id):
            return stored.turn_id
        return self._start(text, replace(opts, tenant=stored.tenant))

    async def _submit_new(self, text: str, opts: TurnOptions) -> str:
        owner, event = opts.owner, opts.event
        await self._place(opts.tenant_key)
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
        parked = await parked_turn(self._store)
        if parked is not None and not await self._reset_ends(parked):
            self._parked = parked.turn_id
            raise SessionSuspendedError(
                _parked_refusal(self.session_id, parked.turn_id, parked.held_by)
            )
        request = self._request(text, opts, queued=True)
        record = TurnRecord(
            session_id=self.session_id,
            turn_id=request.turn_id,
            agent=self.agent.name,
            status="queued",
            opening=request.opening,
            event=event,
            created_at=time.time(),
            version=self.agent.turn_version,
            tenant=request.tenant,
        )
        policy = opening_policy(self.agent, request, event).to_dict()
        # A replace cancels the turns before it in the same commit, so no process can
        # run one of them once this one is stored (parked ones are never replaced).
        replaced = (
            [
                r.turn_id
                for r in await self._store.unfinished()
                if r.status != "suspended" and r.cancel_reason is None
            ]
            if opts.replace
            else []
        )

        await self._store.commit(
            [
                *(RequestCancel(turn_id, "replaced") for turn_id in replaced),
                new_turn(record, owner=owner),
                PutStep(policy_step_id(record.turn_id), record.turn_id, policy),
            ]
        )
        if opts.replace:
            self._replace(keep=request.turn_id)
        return self._enqueue(request)

    async def _place(self, tenant: str) -> None:
        """Tell a store that places sessions by tenant (cells) whose turn comes next,
        so a new session is written where its tenant lives."""
        store = self.runtime.store
        if isinstance(store, PlacingStore):
            await store.place(self.session_id, tenant)

    async def _reset_ends(self, parked: TurnRecord) -> bool:
        """Whether a pending reset (recorded by any process) cancelled the parked turn:
        it ends with the old generation, so a new turn may queue behind the reset."""
        if parked.cancel_reason is None:
            return False
        return (await self._store.load(from_index=NO_MESSAGES)).reset_requested

    def open_child_turn(
        self, task: str, trigger: Proactive, turn_id: str, deny: frozenset[str]
    ) -> str:
        """Open (or redeliver) turn ``turn_id`` as a child of another turn's tool call:
        ``trigger`` names the parent agent and ``deny`` carries the parent's denied
        tools. ``turnkit.subagent`` runs child turns through this."""
        return self._start(task, TurnOptions(trigger=trigger, turn_id=turn_id), deny, child=True)

    def _start(
        self,
        text: str,
        opts: TurnOptions,
        deny: frozenset[str] = frozenset(),
        *,
        child: bool = False,
    ) -> str:
        """``start`` after its checks; ``deny`` adds tools a new turn may not use (a
        subagent's child inherits its parent's denials)."""
        if not self.runtime.run_turns:
            raise ConfigurationError(
                "this runtime hands its turns to workers (run_turns=False), so a turn "
                "must be stored for them: use submit() (or turn()), not start()"
            )
        if self._parked is not None and opts.turn_id != self._parked:
            raise SessionSuspendedError(_parked_refusal(self.session_id, self._parked))
        request = self._request(text, opts, deny, queued=False, child=child)
        if opts.replace:
            self._replace(keep=request.turn_id)
        return self._enqueue(request)

    @staticmethod
    def _request(
        text: str,
        opts: TurnOptions,
        deny: frozenset[str] = frozenset(),
        *,
        queued: bool,
        child: bool = False,
    ) -> TurnRequest:
        tid = opts.turn_id or uuid.uuid4().hex
        trigger = opts.trigger
        opening: OpeningMessage = (
            TriggerMessage(text=text, turn_id=tid, by=trigger.by)
            if trigger is not None
            else UserMessage(text=text, turn_id=tid)
        )
        source = trigger.source if trigger is not None else None
        return TurnRequest(
            turn_id=tid,
            opening=opening,
            event=opts.event,
            source=source,
            inherited_deny=deny,
            owner=opts.owner,
            queued=queued,
            tenant=opts.tenant_key,
            child=child,
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
        if not self.runtime.run_turns:
            return self._hand_off(request)
        pending = self._futures.get(tid)
        if pending is not None and not pending.done():
            return tid  # already queued or running here: one delivery is enough
        loop = self.runtime.running_loop()
        if request.trace is None:
            # Whoever asks for the delivery: its spans go under theirs, not under
            # whatever the session's worker task happened to start in.
            request = replace(request, trace=self.runtime.tracer.current())
        future: asyncio.Future[TurnResult] = loop.create_future()
        future.add_done_callback(_mark_exception_seen)
        self._remember(tid, future)
        if self._queue.put(DeliverJob(request, future), ahead=ahead):
            self._ensure_worker()
        return tid

    def _hand_off(self, request: TurnRequest) -> str:
        """Leave a stored turn to the workers (``run_turns=False``), noting where its
        story starts: a new turn's first event, or a resume's ``input.answered``."""
        tid = request.turn_id
        numbered = [e.seq for e in request.announce if e.seq is not None]
        self._handed[tid] = min(numbered) - 1 if numbered else (0 if request.queued else None)
        self._handed.move_to_end(tid)
        while len(self._handed) > _RECENT_RESULTS:
            self._handed.popitem(last=False)
        return tid

    def run_stored(self, record: TurnRecord) -> str:
        """Deliver a turn the store holds (queued, left running, or parked with a
        cancellation to close) in this process; return its id. The store decides
        what the delivery does, so a park this process remembers is not consulted
        (another process may have resumed it since). ``Worker`` and recovery use it."""
        self._parked = None
        text = record.opening.text
        return self._start(text, TurnOptions(turn_id=record.turn_id, tenant=record.tenant))

    def run_stored_reset(self) -> asyncio.Future[ResetResult]:
        """Carry out in this process a reset the store holds as pending (its process
        died before archiving), queued like a delivery; ``Worker`` uses it."""
        future: asyncio.Future[ResetResult] = self.runtime.running_loop().create_future()
        future.add_done_callback(_mark_exception_seen)
        self._queue.put(ResetJob(None, future), ahead=True)
        self._ensure_worker()
        return future

    @property
    def draining(self) -> asyncio.Task[None] | None:
        """The task running this session's queue here, while there is one."""
        return self._worker

    def interrupt(self) -> None:
        """Stop this process's deliveries of the session now, between two awaits,
        leaving their turns open in the store for another process to take over (a
        worker whose grace period on shutdown ran out)."""
        if self._worker is not None:
            self._worker.cancel()

    def _ensure_worker(self) -> None:
        if self._worker is None:
            loop = self.runtime.running_loop()
            self._worker = loop.create_task(self._drain(), name=f"turnkit:{self.session_id}")
            self.runtime.mark_busy(self)

    @property
    def idle(self) -> bool:
        """Whether nothing of this session is queued, running or being reset here, and
        nobody waits here for a turn's result: the runtime may then drop this object
        (the store keeps everything; a later ``runtime.session`` makes a new one)."""
        return (
            self._worker is None
            and self._queue.idle
            and not self._resets_pending
            and all(f.done() for f in self._futures.values())
        )

    async def turn(
        self,
        text: str,
        options: TurnOptions | None = None,
        /,
        **keywords: Unpack[TurnKeywords],
    ) -> str:
        """Submit a turn (durably, see ``submit``) and wait for its answer; raise
        ``TurnFailedError`` if it fails, ``TurnSuspendedError`` (carrying the request)
        if it parks for input and ``TurnCancelledError`` if it is cancelled."""
        result = await self._turn_result(text, turn_options(options, keywords))
        return result.text or ""

    async def turn_output(
        self,
        text: str,
        output_type: type[_T],
        options: TurnOptions | None = None,
        /,
        **keywords: Unpack[TurnKeywords],
    ) -> _T:
        """``turn``, for an agent with an ``output_type``: wait for the answer and return
        it parsed, typed as ``output_type``, which must be the agent's own
        (``ConfigurationError`` otherwise, before anything runs). Raises what
        ``turn`` raises."""
        if output_type is not self.agent.output_type:
            raise ConfigurationError(
                f"turn_output({getattr(output_type, '__name__', output_type)}): agent "
                f"{self.agent.name!r} answers with output_type={self.agent.output_type!r}"
            )
        result = await self._turn_result(text, turn_options(options, keywords))
        return result.output_as(output_type)

    async def _turn_result(self, text: str, opts: TurnOptions) -> TurnResult:
        """Submit a turn and wait for it to complete, raising for any other ending."""
        tid = await self.submit(text, opts)
        result = await self.result(tid)
        if result.status == "suspended" and result.request is not None:
            raise TurnSuspendedError(result.turn_id, result.request, result.requests)
        if result.status == "suspended":
            raise TurnHeldError(result.turn_id, result.error or "held by another version")
        if result.status == "cancelled":
            raise TurnCancelledError(result.turn_id, result.reason or "requested")
        if result.status != "completed":
            raise TurnFailedError(result.turn_id, result.error or result.status)
        return result

    async def resume(
        self,
        turn_id: str,
        input_id: str,
        value: Any,
        *,
        by: str | None = None,
        granted: Grant | None = None,
        source: str | None = None,
    ) -> str:
        """Answer the parked turn's request and replay it; return the turn id.

        ``by`` is the answerer's verified identity (never what a user typed);
        ``granted`` is a ``Grant`` from ``grant_answer`` for a policy answerer;
        ``source`` names the channel the answer came through, for the record
        (``session.answers()``). A decision request takes a ``Decision`` (or its
        ``to_dict()`` form) as ``value``.
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
        request = await record_answer(
            self._store,
            self._grants,
            turn_id,
            input_id,
            value,
            by=by,
            granted=granted,
            source=source,
        )
        self._parked = None
        return self._enqueue(request)

    # -- forking and delivering again ---------------------------------------------

    async def fork(
        self,
        at: int | str | None = None,
        *,
        new_session: str | None = None,
        generation: int | None = None,
        agent: str | None = None,
    ) -> AgentSession:
        """A new session holding this one's history up to ``at``, and nothing after.

        ``at`` is a transcript position (how many messages to keep), a step id
        (``model:<n>``, ``tool:<n>:<call_id>``: keep what came before that step) or
        ``None`` (everything, a parked turn staying parked). The turn cut at the
        fork point is stored ``running`` for ``redeliver()`` to carry on; nothing
        before it runs again. ``generation`` forks an archived generation
        (``s1#g0``) instead of the live one; ``agent`` (of this runtime) runs the
        fork instead of this session's agent: another model, other tools. The
        original is only read. See ``docs/fork-and-replay.md``.
        """
        name = agent or self.agent.name
        if name not in self.runtime.agents:
            raise ConfigurationError(
                f"unknown agent {name!r}; this runtime has {sorted(self.runtime.agents)}"
            )
        made = await fork_session(
            self.runtime.store,
            self.session_id,
            at=at,
            new_session=new_session,
            generation=generation,
            agent=name,
        )
        return self.runtime.session(name, made.session_id)

    async def redeliver(self, turn_id: str | None = None) -> TurnResult:
        """Deliver again, here, a turn the store holds ``running`` (a fork's cut turn,
        a turn a dead process left) or ``failed`` (a retry from its last committed
        step), and wait for how it ends. Without ``turn_id``: the session's newest
        such turn. ``ConfigurationError`` if there is none, or the turn is in
        another state (a parked turn is answered with ``resume``)."""
        if turn_id is None:
            record = await _newest_redeliverable(self._store)
        else:
            record = await self._store.turn(turn_id)
        if record is None or record.status not in ("running", "failed"):
            found = "no such turn" if record is None else f"it is {record.status}"
            which = turn_id or "no running or failed turn"
            raise ConfigurationError(
                f"session {self.session_id}: cannot deliver {which} again ({found})"
                if turn_id is not None
                else f"session {self.session_id} has {which} to deliver again"
            )
        tid = self.run_stored(record)
        return await self.result(tid)

    async def wake(self, turn_id: str | None = None, *, by: str | None = None) -> bool:
        """End the parked turn's waits on the clock now (``ctx.sleep``, a retry's
        backoff) instead of at their time, and replay it; ``turn_id`` names the turn
        (default: the session's parked one). ``by`` is recorded as who woke it.
        Returns whether there was a wait to end; questions for people stay open."""
        if turn_id is None:
            parked = await parked_turn(self._store)
            if parked is None:
                return False
            turn_id = parked.turn_id
        return await self.settle_clock(turn_id, time.time(), wake=True, by=by) is not None

    async def settle_clock(
        self, turn_id: str, now: float, *, wake: bool = False, by: str | None = None
    ) -> str | None:
        """Act on what the clock has made due of parked turn ``turn_id`` by ``now``
        (its deadlines, reminders, timers; see ``turnkit._runtime.timers``), then have
        it delivered if it runs on; the timer loop calls it. Returns the outcome
        (``resumed``, ``cancel``, ``parked``), or ``None`` when nothing was due."""
        woken = await settle_due(self._store, turn_id, now, wake=wake, by=by)
        if woken is None:
            return None
        if woken.outcome == "parked":
            for event in woken.events:  # reminders: there is no delivery to tell them
                _emit_quietly(self.runtime.sink, event)
        else:
            self._parked = None
            if not self.runtime.claims_turns:
                record = woken.record
                checkpoint = record.pending
                assert checkpoint is not None  # settle_due found one
                request = replay_request(record, checkpoint, woken.events)
                if woken.outcome == "cancel":
                    request.cancel.cancel("expired")
                self._enqueue(request, ahead=woken.outcome == "cancel")
        return woken.outcome

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
            while (job := self._queue.pop()) is not None:
                if isinstance(job, ResetJob):
                    await self._run_reset(job)
                    continue
                self._queue.current = job.request
                try:
                    await self._deliver(job.request, job.future)
                finally:
                    self._queue.current = None
        finally:
            self._worker = None
            self.runtime.mark_idle(self)
            while (job := self._queue.pop()) is not None:
                what = f"turn {job.request.turn_id}" if isinstance(job, DeliverJob) else "the reset"
                _settle(
                    job.future,
                    TurnError(
                        f"the runtime closed before {what} started; it was never stored, "
                        "so ask again"
                    ),
                )

    async def _finish_left_running(self, turn_id: str) -> None:
        """Deliver first any turn of the session that a dead process left running.

        It was acknowledged, so it must end as its own turn, never be failed as
        interrupted because a later one opened before ``recover()`` ran. If it is in
        fact still running in a live process, that process holds the session's
        writer lock: this delivery waits for it, and then finds the turn ended.
        """
        for left in await self._store.unfinished():
            if left.turn_id == turn_id or left.status != "running":
                continue
            if self.delivering(left.turn_id):
                continue
            text = left.opening.text
            request = self._request(text, TurnOptions(turn_id=left.turn_id), queued=False)
            future: asyncio.Future[TurnResult] = self.runtime.running_loop().create_future()
            future.add_done_callback(_mark_exception_seen)
            self._remember(left.turn_id, future)
            log.info(
                "turn %s was left running by a process that died: finishing it first", left.turn_id
            )
            await self._deliver(request, future)

    async def _deliver(self, request: TurnRequest, future: asyncio.Future[TurnResult]) -> None:
        # Let observers that were set up right after start() subscribe before we run:
        # with a local store a whole turn can otherwise finish without yielding once.
        await asyncio.sleep(0)
        if not request.child:
            await self._place(request.tenant)
        await self._finish_left_running(request.turn_id)
        for event in request.announce:
            _emit_quietly(self.runtime.sink, event)
        runner = TurnRunner(
            agent=self.agent,
            store=self._store,
            sink=self.runtime.sink,
            request=request,
            children=self.runtime.children,
            known=self._known,
            tracer=self.runtime.tracer,
            budget=self.runtime.budget,
            rates=self.runtime.rates,
        )
        gate = None if request.child else self.runtime.tenant_gate(request.tenant)
        try:
            if gate is None:
                result = await runner.run()
            else:
                async with gate:
                    result = await runner.run()
            self._known.messages = runner.transcript
            self._known.generation = runner.generation
            final = result.status in ("completed", "cancelled")
            self._known.finished = request.turn_id if final else None
            if result.status == "suspended":
                self._parked = request.turn_id
            future.set_result(result)
        except FencedError as exc:
            # Expected after a pause: another process owns the turn now; one line.
            self._known.forget()
            self.runtime.note_fenced()
            log.warning("turn %s was taken over; this process stopped it: %s", request.turn_id, exc)
            future.set_exception(exc)
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
        for request in self._queue.requests():
            if request.turn_id != keep:
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
                await self._store.commit([RequestCancel(record.turn_id, reason)])
            if record.status == "suspended":
                self._parked = None
                self._close_parked(record, reason)
        return recorded

    def _close_parked(self, record: TurnRecord, reason: str) -> None:
        """Have parked turn ``record``, whose cancellation the store holds, closed as
        cancelled: no delivery of it is running to reach a boundary, so one is queued
        (ahead of a reset being requested) that ends it at its first."""
        request = TurnRequest(turn_id=record.turn_id, opening=record.opening)
        request.cancel.cancel(reason)
        self._enqueue(request, ahead=True)

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
        if (bad := unstorable(reason)) is not None:
            raise ConfigurationError(f"cancel reason {reason!r} contains {bad}")
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
        snap = await self._store.load(from_index=0)
        found: list[AgentSession] = []
        for record in unfinished:
            step = next_step(snap.messages, record.turn_id)
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

        Records the reset in the store as a barrier, cancelling the unfinished turns
        stored before it (reason ``reset``) in the same write; then, once they have
        unwound, archives the transcript, steps, events and turns under the current
        generation number and empties the live session (status ``new``) in one
        transaction. Turns stored after the request, from any process, run in the
        new generation, in order; whichever process next holds the session's writer
        lock carries the archive out, so it happens even if this one dies first.
        ``resume`` refuses here until it is done.
        """
        return await self._reset(erase=None)

    async def erase(self, *, by: str | None = None) -> None:
        """Delete everything the store keeps of this session, for good.

        First a reset's barrier, as ``reset()`` records it (every unfinished turn
        cancelled, running ones stopped at their next boundary in whatever process runs
        them, parked ones closed), but nothing is archived; then, under the session's
        writer lock and in one transaction, its messages, steps, events and turns, live
        and in every archived generation, are deleted. What stays is a tombstone: the
        session id, agent and owner (so the id never passes to another owner), ``by``
        (who asked; ``None`` for code) and when, and the last event number (numbering
        carries on). The session can take turns again, from an empty history.

        Rows a local tool wrote to the app's own tables through ``ctx.store`` are
        the app's to delete, as are child sessions (``subagent``), which are
        sessions of their own.
        """
        if by is not None and (not isinstance(by, str) or not by):
            raise ConfigurationError(f"erase(by=...) must be a non-empty str or None, got {by!r}")
        if by is not None and (bad := unstorable(by)) is not None:
            raise ConfigurationError(f"erase(by={by!r}) contains {bad}")
        await self._reset(erase=Erase(by))

    async def _reset(self, *, erase: Erase | None) -> ResetResult:
        self._resets_pending += 1
        # Turns started from now on queue behind this reset, even those started
        # while its cancellation is still being recorded; a later reset queues
        # behind this one.
        first = self._queue.hold()
        try:
            try:
                self._parked = None  # a stale park is archived with everything else
                since = await self._request_reset()
                future: asyncio.Future[ResetResult] = self.runtime.running_loop().create_future()
                self._queue.put(ResetJob(since, future, erase), ahead=first)
            finally:
                if first:
                    self._queue.release()
                    if len(self._queue):
                        self._ensure_worker()
            return await future
        finally:
            self._resets_pending -= 1

    async def _request_reset(self) -> int:
        """Record the reset's barrier in the store (see ``RequestReset``)
        and stop what it cancels: deliveries here at once, those elsewhere at their
        next boundary (the cancellations are announced), parked turns closed, child
        turns cancelled. Returns the live generation it found."""
        self._signal_all("reset")
        children = await self._unfinished_children()  # before the parent's calls close
        unfinished = await self._store.unfinished()
        generation = (await self._store.load(from_index=NO_MESSAGES)).generation

        await self._store.commit(
            [
                # Announced to the process running each ...
                *(
                    RequestCancel(record.turn_id, "reset")
                    for record in unfinished
                    if record.cancel_reason is None
                ),
                RequestReset(),  # ... and any stored since we read them
            ]
        )
        for record in unfinished:
            if record.status == "suspended":
                self._close_parked(record, record.cancel_reason or "reset")
        for child in children:
            await child.cancel("reset")
        return generation

    async def _run_reset(self, job: ResetJob) -> None:
        since, future = job.since, job.future
        self._known.forget()
        try:
            async with self._store.writer():
                if job.erase is None:
                    result = await self._archive(since)
                else:  # nothing is archived: all of it goes, the pending reset's mark too
                    await self._store.commit([EraseSession(job.erase.by)])
                    snap = await self._store.load(from_index=NO_MESSAGES)
                    result = ResetResult(
                        previous_session=None, archived_generation=None, generation=snap.generation
                    )
        except Exception as exc:
            _settle(future, exc)
            return
        except BaseException as exc:
            _settle(future, TurnError(f"the reset was interrupted ({type(exc).__name__})"))
            raise
        self._parked = None
        future.set_result(result)

    async def _archive(self, since: int | None) -> ResetResult:
        """Carry the pending reset out under the writer, unless another process (a
        worker delivering a turn stored after it) did first; ``since`` is the live
        generation when it was requested. A generation that held nothing (status
        ``new``) archives nothing."""
        archived = await carry_out_reset(self._store, self.agent.name)
        if archived is None:
            generation = (await self._store.load(from_index=NO_MESSAGES)).generation
            if since is None or generation == since:
                return ResetResult(
                    previous_session=None, archived_generation=None, generation=generation
                )
            archived = since  # carried out elsewhere
        return ResetResult(
            previous_session=f"{self.session_id}#g{archived}",
            archived_generation=archived,
            generation=archived + 1,
        )


def _owner_refusal(session_id: str, owner: str) -> str:
    return (
        f"session {session_id} was not opened by {owner!r}; a turn for one "
        "owner cannot run in a session another owner (or code) opened"
    )


def _text(text: object) -> str:
    """A turn's text, checked."""
    if not isinstance(text, str):
        raise TypeError(f"turn text must be a str, got {type(text).__name__}")
    return text


def _parked_refusal(session_id: str, turn_id: str, held_by: str | None = None) -> str:
    if held_by is not None:
        return (
            f"session {session_id} waits on turn {turn_id}, held by agent version "
            f"{held_by} (see docs/deploying.md); run it under a version that takes it "
            "on, cancel it, or reset the session before starting another turn"
        )
    return (
        f"session {session_id} is waiting for input on turn {turn_id}; "
        "resume it (or reset the session) before starting another turn"
    )


def _emit_quietly(sink: EventSink, event: TurnEvent) -> None:
    """Tell observers ``event``; a sink that raises is logged, never the turn's problem."""
    try:
        sink.emit(event)
    except Exception:
        log.exception("event sink raised on %s; ignored", event.type)


def _settle(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _mark_exception_seen(future: asyncio.Future[Any]) -> None:
    """Mark a failed turn's exception as seen: it is logged already, and a caller
    that never awaits ``result()`` should not get an asyncio warning for it."""
    if not future.cancelled():
        future.exception()


async def _newest_redeliverable(store: SessionStore) -> TurnRecord | None:
    """The newest ``running`` turn, else the newest ``failed`` one of the transcript."""
    running = [t for t in await store.unfinished() if t.status == "running"]
    if running:
        return running[-1]
    messages = (await store.load(from_index=0)).messages
    if not messages:
        return None
    last = await store.turn(messages[-1].turn_id)
    return last if last is not None and last.status == "failed" else None
