"""``SessionClient``: one session as a process that runs no turns sees it.

It stores what a caller asks for (a submitted turn, an answer, a cancellation, a
reset) for whichever process runs the session's turns, and follows those turns
through the store. ``AgentSession`` is a ``SessionClient`` that also runs them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from typing import Any, Protocol, TypeVar, Unpack

from .._engine.agent import Agent
from .._engine.context import make_idempotency_key
from .._engine.loop import opening_policy
from .._engine.position import RunTools, next_step
from .._engine.reset import carry_out_reset
from .._errors import (
    ConfigurationError,
    ResumeConflictError,
    SessionOwnerError,
    SessionSuspendedError,
    StoreError,
    TurnCancelledError,
    TurnFailedError,
    TurnHeldError,
    TurnSuspendedError,
)
from .._seams.placing import PlacingStore
from .._seams.relay import EventRelay
from .._seams.sink import EventSink
from .._seams.store import NO_MESSAGES, SessionStore, Store, parked_turn
from .._values.events import TurnEvent
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
from .children import child_session_id
from .clock import Woken, settle_due
from .forking import fork_session
from .remote import Remote, wait_for_end
from .resuming import record_answer, replay_request
from .session_queue import Erase
from .session_view import SessionView, ViewHost

log = logging.getLogger("turnkit.runtime")

_T = TypeVar("_T")

#: How many recent turns each session remembers in memory (their results here, or
#: where the story of a turn handed to the workers starts).
RECENT_TURNS = 256


class ClientHost(ViewHost, Protocol):
    """What a ``SessionClient`` needs of its client (``RuntimeClient`` is one)."""

    @property
    def agents(self) -> dict[str, Agent]: ...

    @property
    def store(self) -> Store: ...

    @property
    def placing(self) -> PlacingStore | None: ...

    @property
    def poll(self) -> float: ...

    @property
    def relay(self) -> EventRelay | None: ...

    def session(self, agent_name: str, session_id: str) -> SessionClient: ...


class SessionClient(SessionView):
    """One conversation with one agent, addressed by ``session_id``, seen from a
    process that stores turns for the workers and follows them through the store
    (``RuntimeClient.session``)."""

    runtime: ClientHost

    def __init__(
        self, runtime: ClientHost, agent: Agent, store: SessionStore, grants: GrantSealer
    ) -> None:
        self.runtime = runtime
        self.agent = agent
        self._store = store
        # Checks the grants resume is given (and grant_answer seals them); the
        # runtime's own, never a public attribute.
        self._grants = grants
        self._resets_pending = 0
        #: Resets asked here, carried out one after another in the order asked.
        self._resetting = asyncio.Lock()
        #: Turns handed to the workers and the event each one's story goes on after
        #: (``None``: from when it is observed).
        self._handed: OrderedDict[str, int | None] = OrderedDict()
        #: The turn this process saw park, so a session that runs turns can refuse
        #: ``start`` at once; the store stays the authority.
        self._parked: str | None = None
        #: Submits of this session in this process, one at a time in call order
        #: (asyncio's lock is first come, first served): the order of the calls is
        #: the order of acknowledgement is the order in the store's queue.
        self._submitting = asyncio.Lock()
        #: Whether a read here found the session this agent's. A session's agent never
        #: changes (an erased one keeps it in its tombstone), so a submit need not read
        #: the session again; if it was pruned and another agent took the id, the
        #: delivery, which reads it under the writer lock, fails the turn.
        self._agent_seen = False

    @property
    def idle(self) -> bool:
        """Whether nothing of this session is being reset here: the client may then
        drop this object (the store keeps everything)."""
        return not self._resets_pending

    def delivering(self, turn_id: str) -> bool:
        """Whether this process has the turn queued or running right now (a client
        runs none)."""
        return False

    # -- what this process does with what it stored --------------------------------

    def _accepted(self, request: TurnRequest, *, ahead: bool = False) -> str:
        """The store holds ``request``'s turn (or its answer): leave it to the workers,
        noting where its story starts (a new turn's first event, or a resume's
        ``input.answered``), and return its id. ``ahead``: a closed park."""
        tid = request.turn_id
        numbered = [e.seq for e in request.announce if e.seq is not None]
        self._handed[tid] = min(numbered) - 1 if numbered else (0 if request.queued else None)
        self._handed.move_to_end(tid)
        while len(self._handed) > RECENT_TURNS:
            self._handed.popitem(last=False)
        return tid

    def _resent(self, stored: TurnRecord, text: str, opts: TurnOptions) -> str:
        """A turn id the store has, sent again: follow that turn (see ``submit``)."""
        return stored.turn_id

    def _signal_all(self, reason: str, *, keep: str | None = None) -> list[str]:
        """Stop this process's deliveries of the session (but ``keep``); return
        their turn ids. A client runs none."""
        return []

    def _woken(self, woken: Woken) -> None:
        """The clock ended a parked turn's wait: have it delivered."""
        record = woken.record
        checkpoint = record.pending
        assert checkpoint is not None  # settle_due found one
        request = replay_request(record, checkpoint, woken.events)
        if woken.outcome == "cancel":
            request.cancel.cancel("expired")
        self._accepted(request, ahead=woken.outcome == "cancel")

    def _agent_checked(self) -> bool:
        """Whether this process has read the session and found it this agent's."""
        return self._agent_seen

    # -- following turns -------------------------------------------------------

    async def _ended(self, turn_id: str) -> TurnRecord:
        return await wait_for_end(self._store, turn_id, self.runtime.poll)

    def _remote(self, turn_id: str) -> Remote | None:
        return Remote(self._handed.get(turn_id), self.runtime.poll, self.runtime.relay)

    # -- submitting turns ----------------------------------------------------------

    async def submit(
        self,
        text: str,
        options: TurnOptions | None = None,
        /,
        **keywords: Unpack[TurnKeywords],
    ) -> str:
        """Queue a turn durably and return its id once the store holds it.

        The turn is recorded as ``queued`` before this returns, so a crash from then
        on loses nothing: a process that runs the session's turns runs it, in
        order. Refusals are read from the store, so they hold in every process:
        ``SessionSuspendedError`` while the session waits for input,
        ``ConfigurationError`` for a session of another agent,
        ``SessionOwnerError`` for one ``owner`` did not open. Sending the
        ``turn_id`` of a turn the store already has is a retry: it stores nothing
        and returns the id, so the caller follows the turn already there, as it was
        stored. Concurrent calls are acknowledged, stored and run in the order they
        were made; a retry keeps the tenant the turn was stored with. The options
        (``TurnOptions``, or its fields as keywords) are described there.
        """
        opts = turn_options(options, keywords)
        text = turn_text(text)
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

    async def _submit_new(self, text: str, opts: TurnOptions) -> str:
        owner, event = opts.owner, opts.event
        await self._place(opts.tenant_key)
        if not self._agent_checked() or owner is not None:
            snap = await self._store.load(from_index=NO_MESSAGES)
            if snap.agent is not None and snap.agent != self.agent.name:
                raise ConfigurationError(
                    f"session {self.session_id} belongs to agent {snap.agent!r}, "
                    f"not {self.agent.name!r}"
                )
            if owner is not None and snap.agent is not None and snap.owner != owner:
                raise SessionOwnerError(owner_refusal(self.session_id, owner))
            self._agent_seen = snap.agent is not None
        parked = await parked_turn(self._store)
        if parked is not None and not await self._reset_ends(parked):
            self._parked = parked.turn_id
            raise SessionSuspendedError(
                parked_refusal(self.session_id, parked.turn_id, parked.held_by)
            )
        request = turn_request(text, opts, queued=True)
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
        return self._accepted(request)

    async def _place(self, tenant: str) -> None:
        """Tell a store that places sessions by tenant (cells) whose turn comes next,
        so a new session is written where its tenant lives."""
        placing = self.runtime.placing
        if placing is not None:
            await placing.place(self.session_id, tenant)

    async def _reset_ends(self, parked: TurnRecord) -> bool:
        """Whether a pending reset (recorded by any process) cancelled the parked turn:
        it ends with the old generation, so a new turn may queue behind the reset."""
        if parked.cancel_reason is None:
            return False
        return (await self._store.load(from_index=NO_MESSAGES)).reset_requested

    def _replace(self, *, keep: str) -> None:
        """Cancel the session's other unfinished turns (reason ``replaced``): the ones
        here at once, and, recorded in the store, those running in any other process
        (they stop at their next boundary). Never ``keep``, never a parked approval."""
        self._signal_all("replaced", keep=keep)
        self.runtime.spawn(self._record_cancel_quietly("replaced", keep=keep))

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

    # -- answering and waking ---------------------------------------------------------

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
        return self._accepted(
            await self._answered(turn_id, input_id, value, by=by, granted=granted, source=source)
        )

    async def _answered(
        self,
        turn_id: str,
        input_id: str,
        value: Any,
        *,
        by: str | None,
        granted: Grant | None,
        source: str | None = None,
    ) -> TurnRequest:
        """Store the answer (see ``resume``); the delivery that replays the turn."""
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
        return request

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
                emit_quietly(self.runtime.sink, event)
        else:
            self._parked = None
            self._woken(woken)
        return woken.outcome

    # -- forking ----------------------------------------------------------------------

    async def _fork(
        self,
        at: int | str | None,
        new_session: str | None,
        generation: int | None,
        agent: str | None,
    ) -> tuple[str, str]:
        """Store the fork (see ``fork``); return its agent's name and session id."""
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
        return name, made.session_id

    async def fork(
        self,
        at: int | str | None = None,
        *,
        new_session: str | None = None,
        generation: int | None = None,
        agent: str | None = None,
    ) -> SessionClient:
        """A new session holding this one's history up to ``at``, and nothing after.

        ``at`` is a transcript position (how many messages to keep), a step id
        (``model:<n>``, ``tool:<n>:<call_id>``: keep what came before that step) or
        ``None`` (everything, a parked turn staying parked). The turn cut at the
        fork point is stored ``running`` for a process that runs turns to carry on
        (``redeliver()``); nothing before it runs again. ``generation`` forks an
        archived generation (``s1#g0``) instead of the live one; ``agent`` (of this
        runtime) runs the fork instead of this session's agent: another model, other
        tools. The original is only read. See ``docs/fork-and-replay.md``.
        """
        name, session_id = await self._fork(at, new_session, generation, agent)
        return self.runtime.session(name, session_id)

    # -- cancellation and reset -------------------------------------------------

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
        cancelled: no delivery of it is running to reach a boundary, so one is asked
        for (ahead of a reset being requested) that ends it at its first."""
        request = TurnRequest(turn_id=record.turn_id, opening=record.opening)
        request.cancel.cancel(reason)
        self._accepted(request, ahead=True)

    async def _record_cancel_quietly(self, reason: str, keep: str) -> None:
        try:
            await self._record_cancel(reason, keep=keep)
        except Exception as exc:
            # The in-memory signal still stops the turns; only crash-durability is lost.
            log.warning(
                "recording the %s cancellation on %s failed: %s", reason, self.session_id, exc
            )

    async def _unfinished_children(self) -> list[SessionClient]:
        """The sessions of child turns (``turnkit.subagent``) that this session's
        unfinished turns are waiting on and that have not ended, wherever they run.

        A child's session and turn ids derive from the parent call's idempotency
        key, so they are found from the calls the parent still owes a result."""
        unfinished = await self._store.unfinished()
        if not unfinished:
            return []
        snap = await self._store.load(from_index=0)
        found: list[SessionClient] = []
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
        """Record the barrier, then carry the reset out here under the session's writer
        lock (once the process running its turns has let the session go); resets
        asked here go one after another."""
        self._resets_pending += 1
        try:
            async with self._resetting:
                since = await self._request_reset()
                return await self._carry_out(since, erase)
        finally:
            self._resets_pending -= 1

    async def _request_reset(self) -> int:
        """Record the reset's barrier in the store (see ``RequestReset``)
        and stop what it cancels: deliveries here at once, those elsewhere at their
        next boundary (the cancellations are announced), parked turns closed, child
        turns cancelled. Returns the live generation it found."""
        self._parked = None  # a stale park is archived with everything else
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

    async def _carry_out(self, since: int | None, erase: Erase | None) -> ResetResult:
        """Archive (or erase) under the session's writer lock what the pending reset
        retires; ``since`` is the live generation when it was requested."""
        async with self._store.writer():
            if erase is None:
                return await self._archive(since)
            # Nothing is archived: all of it goes, the pending reset's mark too.
            await self._store.commit([EraseSession(erase.by)])
            snap = await self._store.load(from_index=NO_MESSAGES)
        return ResetResult(
            previous_session=None, archived_generation=None, generation=snap.generation
        )

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


def turn_request(
    text: str,
    opts: TurnOptions,
    deny: frozenset[str] = frozenset(),
    *,
    queued: bool,
    child: bool = False,
    claimed: bool = False,
) -> TurnRequest:
    """The delivery a new turn asks for: its id (a new one unless given), its
    opening message (a trigger's, or the user's) and where it came from."""
    tid = opts.turn_id or uuid.uuid4().hex
    trigger = opts.trigger
    opening: OpeningMessage = (
        TriggerMessage(text=text, turn_id=tid, by=trigger.by)
        if trigger is not None
        else UserMessage(text=text, turn_id=tid)
    )
    return TurnRequest(
        turn_id=tid,
        opening=opening,
        event=opts.event,
        source=trigger.source if trigger is not None else None,
        inherited_deny=deny,
        owner=opts.owner,
        queued=queued,
        tenant=opts.tenant_key,
        child=child,
        claimed=claimed,
    )


def turn_text(text: object) -> str:
    """A turn's text, checked."""
    if not isinstance(text, str):
        raise TypeError(f"turn text must be a str, got {type(text).__name__}")
    return text


def owner_refusal(session_id: str, owner: str) -> str:
    return (
        f"session {session_id} was not opened by {owner!r}; a turn for one "
        "owner cannot run in a session another owner (or code) opened"
    )


def parked_refusal(session_id: str, turn_id: str, held_by: str | None = None) -> str:
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


def emit_quietly(sink: EventSink, event: TurnEvent) -> None:
    """Tell observers ``event``; a sink that raises is logged, never the turn's problem."""
    try:
        sink.emit(event)
    except Exception:
        log.exception("event sink raised on %s; ignored", event.type)
