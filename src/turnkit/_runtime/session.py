"""``AgentSession``: a session whose turns this process runs, one after another.

It is a ``SessionClient`` (what it stores, it stores the same way) that also
delivers: turns on one session run in the order they were started, and a reset
cancels what is unfinished and archives behind it, both through its
``SessionQueue``. Nothing here touches SQL or a model: it schedules
``TurnRunner``s over the seams it was given.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Protocol, Unpack

from .._engine.agent import Agent
from .._engine.loop import KnownTranscript, TurnRunner
from .._engine.rate_waits import RateLimiter
from .._errors import ConfigurationError, FencedError, SessionSuspendedError, TurnError
from .._seams.store import SessionStore
from .._seams.tracer import Tracer
from .._values.budgets import Budget
from .._values.records import TurnRecord
from .._values.turn_options import TurnKeywords, TurnOptions, turn_options
from .._values.turns import ResetResult, TurnRequest, TurnResult
from .approvals import Grant, GrantSealer
from .children import RuntimeChildren
from .clock import Woken
from .observe import finished_record
from .remote import Remote
from .session_client import (
    RECENT_TURNS,
    ClientHost,
    SessionClient,
    emit_quietly,
    parked_refusal,
    turn_request,
    turn_text,
)
from .session_queue import DeliverJob, Erase, ResetJob, SessionQueue
from .tenant_slots import TenantSlots, excuse

log = logging.getLogger("turnkit.runtime")


class SessionHost(ClientHost, Protocol):
    """What a session that runs turns needs of its runtime (``Runtime`` is one)."""

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

    def tenant_gate(self, tenant: str) -> TenantSlots | None: ...

    @property
    def budget(self) -> Budget | None: ...

    @property
    def rates(self) -> RateLimiter | None: ...

    def session(self, agent_name: str, session_id: str) -> AgentSession: ...

    def note_fenced(self) -> None:
        """Count a delivery stopped because another process took its turn over."""


class AgentSession(SessionClient):
    """One conversation with one agent, addressed by ``session_id``, whose turns run
    in this process (``Runtime.session``)."""

    runtime: SessionHost

    def __init__(
        self, runtime: SessionHost, agent: Agent, store: SessionStore, grants: GrantSealer
    ) -> None:
        super().__init__(runtime, agent, store, grants)
        self._queue = SessionQueue()
        self._known = KnownTranscript()
        #: This process's deliveries of the session's recent turns, by turn id.
        self._futures: OrderedDict[str, asyncio.Future[TurnResult]] = OrderedDict()
        self._worker: asyncio.Task[None] | None = None
        #: Tickets for the tenant's slot of deliveries queued or waiting here, by turn
        #: id: excused (the delivery rides on its parent's slot) when a parent's
        #: delivery asks for a child turn already queued here, as recovery queues it.
        self._tickets: dict[str, asyncio.Future[bool]] = {}

    def delivering(self, turn_id: str) -> bool:
        """Whether this process has the turn queued or running right now."""
        future = self._futures.get(turn_id)
        return future is not None and not future.done()

    # -- how it differs from a client: it delivers what it stores ------------------

    def _accepted(self, request: TurnRequest, *, ahead: bool = False) -> str:
        return self._enqueue(request, ahead=ahead)

    def _resent(self, stored: TurnRecord, text: str, opts: TurnOptions) -> str:
        """A turn id the store has, sent again: follow that turn, delivering it here
        unless it is delivering here already."""
        if self.delivering(stored.turn_id):
            return stored.turn_id
        return self._start(text, replace(opts, tenant=stored.tenant))

    def _woken(self, woken: Woken) -> None:
        if not self.runtime.claims_turns:  # else a worker claims it
            super()._woken(woken)

    def _agent_checked(self) -> bool:
        return self._agent_seen or self._known.messages is not None

    def _local(self, turn_id: str) -> asyncio.Future[TurnResult] | None:
        return self._futures.get(turn_id)

    async def _ended(self, turn_id: str) -> TurnRecord:
        return await finished_record(self._store, turn_id)

    def _remote(self, turn_id: str) -> Remote | None:
        return None

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
        return self._start(turn_text(text), turn_options(options, keywords))

    def open_child_turn(self, task: str, opts: TurnOptions, deny: frozenset[str]) -> str:
        """Open (or redeliver) turn ``opts.turn_id`` as a child of another turn's tool
        call: ``opts`` names the parent agent (its trigger) and the parent's tenant,
        ``deny`` carries the parent's denied tools. ``turnkit.subagent`` runs child
        turns through this; the delivery rides on the parent's tenant slot."""
        return self._start(task, opts, deny, child=True)

    async def resume_child(
        self, turn_id: str, input_id: str, value: Any, *, by: str | None, granted: Grant | None
    ) -> str:
        """``resume`` for a parent whose call passes its answer on to this child turn:
        the replay runs inside the parent's call, so on the parent's tenant slot."""
        request = await self._answered(turn_id, input_id, value, by=by, granted=granted)
        return self._enqueue(replace(request, child=True))

    def _start(
        self,
        text: str,
        opts: TurnOptions,
        deny: frozenset[str] = frozenset(),
        *,
        child: bool = False,
        claimed: bool = False,
    ) -> str:
        """``start`` after its checks; ``deny`` adds tools a new turn may not use (a
        subagent's child inherits its parent's denials)."""
        if self._parked is not None and opts.turn_id != self._parked:
            raise SessionSuspendedError(parked_refusal(self.session_id, self._parked))
        request = turn_request(text, opts, deny, queued=False, child=child, claimed=claimed)
        if opts.replace:
            self._replace(keep=request.turn_id)
        return self._enqueue(request)

    def _enqueue(self, request: TurnRequest, *, ahead: bool = False) -> str:
        """Queue a delivery. While a reset is recording its cancellation, new turns
        wait to be queued behind it; ``ahead`` (a cancelled park being closed) goes
        straight in, before the reset."""
        tid = request.turn_id
        pending = self._futures.get(tid)
        if pending is not None and not pending.done():
            if request.child:  # its parent waits for it, holding the tenant's slot
                self._excuse(tid)
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

    def _excuse(self, turn_id: str) -> None:
        """The delivery of ``turn_id`` queued here (by recovery) is a child turn its
        parent's delivery now waits for: it rides on the parent's slot, not waiting
        for one of its own (the parent may hold the tenant's last)."""
        ticket = self._tickets.get(turn_id)
        if ticket is None:
            ticket = self._tickets[turn_id] = self.runtime.running_loop().create_future()
        excuse(ticket)

    def run_stored(self, record: TurnRecord, *, claimed: bool = False) -> str:
        """Deliver a turn the store holds (queued, left running, or parked with a
        cancellation to close) in this process; return its id. The store decides
        what the delivery does, so a park this process remembers is not consulted
        (another process may have resumed it since). ``Worker`` and recovery use it;
        ``claimed``: a queue's claim gave the turn (see ``TurnRequest.claimed``)."""
        self._parked = None
        text = record.opening.text
        opts = TurnOptions(turn_id=record.turn_id, tenant=record.tenant)
        return self._start(text, opts, claimed=claimed)

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

    # -- forking and delivering again ---------------------------------------------

    async def fork(
        self,
        at: int | str | None = None,
        *,
        new_session: str | None = None,
        generation: int | None = None,
        agent: str | None = None,
    ) -> AgentSession:
        """See ``SessionClient.fork``; the fork's turns run in this runtime too."""
        name, session_id = await self._fork(at, new_session, generation, agent)
        return self.runtime.session(name, session_id)

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

    def _remember(self, turn_id: str, future: asyncio.Future[TurnResult]) -> None:
        self._futures[turn_id] = future
        self._futures.move_to_end(turn_id)
        while len(self._futures) > RECENT_TURNS:
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
                    self._tickets.pop(job.request.turn_id, None)
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
            request = turn_request(text, TurnOptions(turn_id=left.turn_id), queued=False)
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
        await self._place(request.tenant)
        if not request.claimed:
            await self._finish_left_running(request.turn_id)
        for event in request.announce:
            emit_quietly(self.runtime.sink, event)
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
        try:
            result = await self._run_in_slot(request, runner)
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

    async def _run_in_slot(self, request: TurnRequest, runner: TurnRunner) -> TurnResult:
        """Run ``runner`` on a slot of the turn's tenant where this process caps it;
        a child turn rides on its parent's slot instead (docs/tenants.md)."""
        gate = None if request.child else self.runtime.tenant_gate(request.tenant)
        if gate is None:
            return await runner.run()
        tid = request.turn_id
        ticket = self._tickets.setdefault(tid, self.runtime.running_loop().create_future())
        held = False
        try:
            held = await gate.take(ticket)
            return await runner.run()
        finally:
            if self._tickets.get(tid) is ticket:
                del self._tickets[tid]
            if held:
                gate.give_back()

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

    async def _reset(self, *, erase: Erase | None) -> ResetResult:
        """Record the barrier, then queue the archive behind what is queued here."""
        self._resets_pending += 1
        # Turns started from now on queue behind this reset, even those started
        # while its cancellation is still being recorded; a later reset queues
        # behind this one.
        first = self._queue.hold()
        try:
            try:
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

    async def _run_reset(self, job: ResetJob) -> None:
        self._known.forget()
        try:
            result = await self._carry_out(job.since, job.erase)
        except Exception as exc:
            _settle(job.future, exc)
            return
        except BaseException as exc:
            _settle(job.future, TurnError(f"the reset was interrupted ({type(exc).__name__})"))
            raise
        self._parked = None
        job.future.set_result(result)


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
