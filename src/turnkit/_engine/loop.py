"""The turn loop: ask the model, run the tools it asked for, repeat, checkpointing each step.

The engine reads its position off the transcript (see ``_position``), talks only to
its seams (``SessionStore``, ``EventSink``, ``Model``, ``Tracer``) and commits every step
together with the events it caused, so a replay resumes at the first unfinished step.
Every delivery ends with a terminal event on the sink, however it ends. ``TurnRunner``
decides what happens next; model and tool steps run in ``model_steps`` and ``tool_steps``,
and the commits that change the turn's state are planned in ``transitions``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, Final, Literal, TypeAlias

from .._errors import ConfigurationError, SessionOwnerError, StoreError
from .._seams.sink import EventSink, LocalEventSink
from .._seams.store import SessionStore
from .._seams.tracer import (
    NO_SPAN,
    NO_TRACER,
    StepSpan,
    StepTrace,
    TraceContext,
    Tracer,
    TurnSpan,
    TurnTrace,
)
from .._values.budgets import Budget
from .._values.events import (
    ENDING_EVENT_TYPES,
    TurnCancelledEvent,
    TurnEvent,
    TurnFailedEvent,
)
from .._values.inputs import InputRequest
from .._values.messages import Message, ToolCall
from .._values.policy import TurnPolicy
from .._values.records import TurnRecord, TurnStatus
from .._values.step_ids import policy_step_id, trace_step_id
from .._values.turn_rules import move
from .._values.turns import TurnCancelled, TurnFailure, TurnRequest, TurnResult, result_from_record
from .._values.usage import Usage, steps_usage
from .._values.writes import LogEvent, PutStep, RequestCancel, Write
from .agent import Agent
from .batch import distinct_ids
from .context import ChildTurns
from .delivery import Course, course, stored_turn
from .known_transcript import KnownTranscript
from .model_steps import ModelSteps
from .output import with_output
from .position import (
    CallModel,
    Finished,
    RunTools,
    count_model_steps,
    has_opening_message,
    next_step,
)
from .rate_waits import RateLimiter
from .reset import carry_out_reset, runs_after_reset
from .tool_results import error_text
from .tool_steps import Park, ToolSteps
from .tracing import UNTRACED, Traced, error_type
from .transitions import (
    Planned,
    Refused,
    opening_policy,
    plan_cancel,
    plan_failure,
    plan_opening,
    plan_park,
    plan_reopen,
)
from .turn_tools import TurnTools
from .version_meeting import meets_version, plan_meeting

__all__ = ["KnownTranscript", "TurnRunner", "opening_policy"]

log = logging.getLogger("turnkit.engine")

TurnStatusResult: TypeAlias = Literal["completed", "failed", "suspended", "cancelled"]


class TurnRunner:
    """Drives one delivery of one turn to its end. Create one per delivery.

    What it is given and makes when created is ``Final``; the rest is what the
    delivery read and committed, which only the runner changes (its collaborators
    see it read-only, through ``Delivery``)."""

    def __init__(
        self,
        *,
        agent: Agent,
        store: SessionStore,
        sink: EventSink,
        request: TurnRequest,
        children: ChildTurns | None = None,
        known: KnownTranscript | None = None,
        tracer: Tracer = NO_TRACER,
        budget: Budget | None = None,
        rates: RateLimiter | None = None,
    ) -> None:
        self.agent: Final = agent
        #: The model rate limits, shared through the store (docs/tenants.md).
        self.rates: Final = rates
        #: The spending limits checked before each model step (docs/tenants.md).
        self.budget: Final = budget
        self.store: Final = store
        self.sink: Final = sink
        #: How the delivery emits an event: straight to a ``LocalEventSink``, which
        #: catches what its subscribers raise and so never raises itself (one call
        #: less an event); to any other sink through ``_emit_guarded`` (bound to the
        #: sink, not to the runner: see ``_loop`` on cycles).
        self.emit: Final[Callable[[TurnEvent], None]] = (
            sink.emit if type(sink) is LocalEventSink else partial(_emit_guarded, sink)
        )
        self.request: Final = request
        self.children: Final = children
        self.known: Final = known
        self.turn_id: Final = request.turn_id
        self.session_id: Final = store.session_id
        self.event = request.event
        self.tenant = request.tenant
        self.transcript: list[Message] = []
        self.steps: dict[str, Any] = {}
        self.next_seq = 1
        #: This delivery's name on its deltas (see ``MessageDeltaEvent.attempt``).
        self.attempt: Final = uuid.uuid4().hex[:12]
        self.generation = 0
        self.store_id = ""
        self._durable_cancel: str | None = None
        #: Known not to be in the store: read as absent, opening commit not attempted
        #: yet (a failed commit may still have landed, so from then on it may be).
        self._unstored = False
        self.policy = TurnPolicy()
        self.tools = TurnTools(agent)
        self._known_finished: str | None = None
        #: The turn as last stored (see ``Delivery.record``).
        self.record: TurnRecord | None = None
        self.tracer: Final = tracer
        self.span: TurnSpan = NO_SPAN
        #: Whether the next step is the first a redelivery runs (see ``StepTrace``).
        self._resuming = False
        #: The error class of the failure the turn ends with, if it fails.
        self._failure: str | None = None
        #: Whether the turn was recorded under another agent version (or held by
        #: one): ``_loop`` checks it against this version before running a step.
        self._meeting = False
        #: What the turn's stored model calls used, in every delivery so far.
        self.usage = Usage()

    async def run(self) -> TurnResult:
        """Run the delivery. An exception escaping here (a store outage) leaves the turn
        open for redelivery; observers still get a live, unlogged ``turn.failed``,
        which says so, or says that nothing was stored when the turn never got as far
        as committing its opening (a session of another agent, a parked session)."""
        try:
            async with self.store.writer():
                result = await self._run()
        except BaseException as exc:
            what = (
                "delivery failed before the turn could end (it stays open): "
                if not self._unstored
                else "the turn could not start (nothing was stored): "
            )
            # Emitting is synchronous, so this is safe even while being cancelled.
            self.emit(
                TurnFailedEvent(
                    turn_id=self.turn_id,
                    session_id=self.session_id,
                    error=what + error_text(exc),
                )
            )
            raise
        # A typed answer is parsed from the text the turn stored, however it ended.
        return with_output(self.agent._output, result)

    async def _run(self) -> TurnResult:
        known = self.known
        prefix = known.messages if known is not None and known.messages is not None else []
        snap = await self.store.load(self.turn_id, from_index=len(prefix))
        if prefix and known is not None and snap.generation != known.generation:
            # Reset elsewhere since we last looked: what we kept is another generation.
            prefix = []
            snap = await self.store.load(self.turn_id)
        if snap.reset_requested and runs_after_reset(snap.turn):
            # A reset was asked for (in any process) and not carried out: this turn
            # came after it, so archive first, under the lock this delivery holds.
            await carry_out_reset(self.store, self.agent.name)
            prefix = []
            snap = await self.store.load(self.turn_id)
        self._unstored = snap.turn is None
        if snap.agent is not None and snap.agent != self.agent.name:
            refusal = (
                f"session {self.session_id} belongs to agent {snap.agent!r}, "
                f"not {self.agent.name!r}"
            )
            if snap.turn is not None and snap.turn.status == "queued":
                # Stored by a node that lost a race for a new session to another
                # agent's (or remembered a session since pruned and taken by another
                # agent): ended here, or every claim would refuse it again.
                self.record = snap.turn
                return await self._settle_queued("failed", error=refusal)
            raise ConfigurationError(refusal)
        owner = self.request.owner
        if owner is not None and snap.agent is not None and snap.owner != owner:
            # Checked under the writer lock, so two first turns racing for a new
            # session cannot both claim it.
            refusal = (
                f"session {self.session_id} was not opened by {owner!r}; a turn for one "
                "owner cannot run in a session another owner (or code) opened"
            )
            if snap.turn is not None and snap.turn.status == "queued":
                self.record = snap.turn
                return await self._settle_queued("failed", error=refusal)  # lost the race
            raise SessionOwnerError(refusal)
        self.transcript = [*prefix, *snap.messages]
        # Nothing was committed since our last delivery: its outcome is still current.
        self._known_finished = (
            known.finished if known is not None and prefix and not snap.messages else None
        )
        # The delivery's own memo from here on: its steps are added as they commit.
        self.steps, self.next_seq = dict(snap.steps.items()), snap.next_seq
        self.usage = steps_usage(self.steps)
        self.generation, self.store_id = snap.generation, snap.store_id
        record = self.record = snap.turn
        if record is None and self.request.queued:
            # Submitted and stored, and gone before it could open: a reset archived it.
            return self._cancelled_unopened("reset")
        if record is not None:
            # A redelivery replays the turn as it was opened, whatever the caller passed.
            self.event = record.event
            self.tenant = record.tenant
            self._durable_cancel = record.cancel_reason
        self.policy = self._resolve_policy()
        self._resuming = record is not None and record.status != "queued"
        trace = TurnTrace(
            session_id=self.session_id,
            turn_id=self.turn_id,
            agent=self.agent.name,
            replayed=self._resuming,
            origin=_trace_context(self.steps.get(trace_step_id(self.turn_id))),
            parent=self.request.trace,
            version=self.agent.turn_version,
        )
        with self.tracer.turn(trace) as span:
            self.span = span
            try:
                result = await self._deliver(record)
            except BaseException as exc:
                span.broke(error_type(exc), error_text(exc))
                raise
            span.ended(result, self._failure)
            return result

    async def _deliver(self, record: TurnRecord | None) -> TurnResult:
        """The delivery once the turn's record is read: replay, open or announce it."""
        version = self.agent.turn_version
        cancel = self.cancel_reason()
        opened = record is not None and has_opening_message(self.transcript, self.turn_id)
        match course(record, opened=opened, version=version, cancel=cancel):
            case "announce" if record is not None:
                # Nothing to run: say again how it ended (a parked turn re-announces
                # its request).
                await self._announce_outcome()
                return result_from_record(record, self.usage)
            case "cancel" if cancel is not None:
                return await self._cancel(cancel)
            case "settle" if cancel is not None:
                return await self._settle_queued("cancelled", reason=cancel)
            case "open" | "reopen" | "run" as run:
                return await self._run_to_end(run, version)
        raise AssertionError(f"turn {self.turn_id}: no course for {record!r}")

    async def _run_to_end(self, run: Course, version: str) -> TurnResult:
        """Open the turn (or run it again), then step it until it ends or parks."""
        try:
            if run == "open":
                await self._open()
            elif run == "reopen":
                await self._apply(plan_reopen(self, stored_turn(self)))
            self._meeting = meets_version(self.record, version)
            return await self._loop()
        except TurnFailure as failure:
            self._failure = error_type(failure)
            return await self._fail(str(failure))
        except Park as park:
            return await self._park(park.requests)
        except TurnCancelled as cancelled:
            # Where the cancellation met the turn is where its last commit left it.
            match self.record:
                case None:  # its opening never committed: nothing is stored
                    return self._cancelled_unopened(cancelled.reason)
                case TurnRecord(status="queued"):
                    return await self._settle_queued("cancelled", reason=cancelled.reason)
                case _:
                    return await self._cancel(cancelled.reason)
        except Refused as refused:
            return await self._settle_queued("failed", error=str(refused))

    def _resolve_policy(self) -> TurnPolicy:
        """The policy stored when the turn was queued or opened; else the one its
        suspend checkpoint carried; else (a new turn) the agent's for its source."""
        stored = self.steps.get(policy_step_id(self.turn_id))
        if stored is not None:
            return TurnPolicy.from_dict(stored)
        if self.request.policy is not None:
            return self.request.policy
        return opening_policy(self.agent, self.request, self.event)

    async def _settle_queued(
        self, status: TurnStatus, *, reason: str | None = None, error: str | None = None
    ) -> TurnResult:
        """End a queued turn that will not open, durably, and tell observers (live:
        nothing of it is in the transcript or the event log)."""
        writes: list[Write] = []
        if reason is not None:
            writes.append(RequestCancel(self.turn_id, reason))  # kept unless one was first
        writes.append(move(stored_turn(self), status, error=error))
        await self.store.commit(writes)
        if status == "cancelled":
            return self._cancelled_unopened(reason or "requested")
        message = error or "the turn could not open"
        self.emit(TurnFailedEvent(turn_id=self.turn_id, session_id=self.session_id, error=message))
        return TurnResult(turn_id=self.turn_id, status="failed", error=message)

    # -- cancellation ------------------------------------------------------------

    def cancel_reason(self) -> str | None:
        """Why this turn is to stop, if it is: asked here, or recorded in the store."""
        return self.request.cancel.reason or self._durable_cancel

    def boundary(self) -> None:
        """A checkpoint boundary: stop here if the turn was cancelled."""
        reason = self.cancel_reason()
        if reason is not None:
            raise TurnCancelled(reason)

    async def step_boundary(self) -> None:
        """A boundary between steps: also stop if another process (or runtime) has
        recorded a cancellation of this turn since the delivery began."""
        # (cancel_reason, poll_cancel and boundary inlined: a step's boundary is crossed
        # twice a model+tool pair.)
        reason = self.request.cancel.reason or self._durable_cancel
        if reason is None:
            self._durable_cancel = await self.store.cancel_reason(self.turn_id)
            reason = self.request.cancel.reason or self._durable_cancel
        if reason is not None:
            raise TurnCancelled(reason)

    async def poll_cancel(self) -> str | None:
        """Why the turn is to stop, asking the store too unless it is known already."""
        if self.cancel_reason() is None:
            self._durable_cancel = await self.store.cancel_reason(self.turn_id)
        return self.cancel_reason()

    def _cancelled_unopened(self, reason: str) -> TurnResult:
        """Cancelled before its opening committed: nothing is stored, observers are told."""
        self.emit(
            TurnCancelledEvent(turn_id=self.turn_id, session_id=self.session_id, reason=reason)
        )
        return TurnResult(turn_id=self.turn_id, status="cancelled", reason=reason)

    async def _cancel(self, reason: str) -> TurnResult:
        await self._apply(plan_cancel(self, reason))
        return self._result("cancelled", reason=reason)

    async def _loop(self) -> TurnResult:
        # The step runners refer to this runner, so it does not keep them: a runner
        # that did (or kept a method of its own) would be in a reference cycle, freed
        # only by the cyclic garbage collector, with everything the delivery read.
        # A loaded worker spent ~11% of its CPU in the collector, one runner a turn.
        tool_steps = ToolSteps(self)
        model_steps = ModelSteps(self, self.known)
        await tool_steps.list_tools()
        if self._meeting:
            planned = await plan_meeting(self)
            await self._apply(planned)
            self.steps.update(
                (w.step_id, w.result) for w in planned.writes if isinstance(w, PutStep)
            )
            record = stored_turn(self)
            if record.held_by is not None:
                return result_from_record(record, self.usage)
        limits, name = self.agent.limits, self.agent.name
        taken = count_model_steps(self.transcript, self.turn_id) if limits.model_steps else 0
        while True:
            step = next_step(self.transcript, self.turn_id)
            if isinstance(step, CallModel):
                await self.step_boundary()
                limits.check_model_call(name, taken, self.usage)
                await model_steps.step(step.index)
                taken += 1
            elif isinstance(step, RunTools):
                if limits.tool_calls is not None:
                    tool_steps.check_limit(step)
                await tool_steps.run(step)
            elif isinstance(step, Finished):
                return self._result("completed", text=step.text)
            else:
                raise StoreError(f"turn {self.turn_id}: opening message missing after commit")

    # -- commits and events ------------------------------------------------------

    async def commit(
        self,
        writes: Sequence[Write],
        events: list[TurnEvent],
        messages: Sequence[Message] = (),
        used: Usage | None = None,
    ) -> None:
        """Commit ``writes`` plus ``events`` (numbered from ``next_seq`` by the
        caller); only then extend the transcript, count ``used`` and emit."""
        await self.store.commit([*writes, *map(LogEvent, events)])
        self.next_seq += len(events)
        self.transcript.extend(messages)
        if used is not None:
            self.usage = self.usage + used
        for event in events:
            self.emit(event)

    def landed(
        self, step_id: str, result: Any, messages: Sequence[Message], event: TurnEvent
    ) -> None:
        """See ``Delivery.landed``."""
        self.steps[step_id] = result
        self.next_seq += 1
        self.transcript.extend(messages)
        self.emit(event)

    def remember(self, step_id: str, result: Any) -> None:
        """See ``Delivery.remember``."""
        self.steps[step_id] = result

    def use_tools(self, tools: TurnTools) -> None:
        """See ``Delivery.use_tools``."""
        self.tools = tools

    def add_usage(self, used: Usage) -> None:
        """See ``Delivery.add_usage``."""
        self.usage = self.usage + used

    async def _apply(self, planned: Planned) -> None:
        await self.commit(planned.writes, planned.events, planned.messages)
        if planned.turn is not None:
            self.record = planned.turn

    async def _announce_outcome(self) -> None:
        """Re-emit the logged ending (terminal, or the park) of a turn with nothing to run."""
        logged = await self.store.events(turn_id=self.turn_id)
        for event in reversed(logged):
            if event.type in ENDING_EVENT_TYPES:
                self.emit(event)
                return
        # Settled while queued: it never opened, so nothing was logged; say it live.
        record, sid = self.record, self.session_id
        if record is not None and record.status == "cancelled":
            reason = record.cancel_reason or "requested"
            self.emit(TurnCancelledEvent(turn_id=self.turn_id, session_id=sid, reason=reason))
        elif record is not None and record.status == "failed":
            error = record.error or "failed"
            self.emit(TurnFailedEvent(turn_id=self.turn_id, session_id=sid, error=error))

    # -- opening, retry, failure -------------------------------------------------

    async def _open(self) -> None:
        queued = self.record if self.record is not None and self.record.status == "queued" else None
        # A queued turn opens as submitted, whoever delivers it.
        opening = queued.opening if queued is not None else self.request.opening
        planned = await plan_opening(
            self,
            opening,
            queued=queued,
            finished=self._known_finished,
            owner=self.request.owner,
        )
        self.boundary()  # the last moment a cancellation leaves no trace
        self._unstored = False
        await self._apply(planned)
        self._opened = True

    async def _fail(self, error: str) -> TurnResult:
        await self._apply(plan_failure(self, error))
        return self._result("failed", error=error)

    async def _park(self, asked: tuple[InputRequest, ...]) -> TurnResult:
        """Park the turn on its requests (one per call that asked), with what a resume
        in another process needs to replay the turn as it was opened."""
        requests = distinct_ids(asked)
        # The stored opening (a redelivery may have been started with other text).
        opening = self.record.opening if self.record else self.request.opening
        await self._apply(plan_park(self, requests, opening))
        return self._result("suspended", request=requests[0], requests=requests)

    def _result(self, status: TurnStatusResult, **outcome: Any) -> TurnResult:
        """How this delivery ends the turn, with what the turn's model calls used."""
        return TurnResult(turn_id=self.turn_id, status=status, usage=self.usage, **outcome)

    # -- steps -------------------------------------------------------------------

    def step_span(
        self, step_id: str, *, call: ToolCall | None = None, model: Any = None
    ) -> AbstractContextManager[StepSpan]:
        """A step's span, told how the step ended (see ``Traced``); only the first step
        a redelivery runs is marked replayed. Untraced, nothing is built for it."""
        resuming, self._resuming = self._resuming, False
        if self.span is NO_SPAN:
            return UNTRACED
        trace = StepTrace(step_id=step_id, replayed=resuming, call=call, model=model)
        return Traced(self.span.step(trace))


def _emit_guarded(sink: EventSink, event: TurnEvent) -> None:
    """Emit to a sink that might raise: what it raises is logged, never fatal."""
    try:
        sink.emit(event)
    except Exception:
        log.exception("event sink raised on %s; ignored", event.type)


def _trace_context(stored: object) -> TraceContext | None:
    """A stored trace context, or ``None`` if there is none (or it is not one)."""
    if isinstance(stored, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in stored.items()
    ):
        return dict(stored)
    return None
