"""The turn loop: ask the model, run the tools it asked for, repeat, checkpointing each step.

The engine reads its position off the transcript (see ``_position``), talks only to
its seams (``SessionStore``, ``EventSink``, ``Model``, ``Tracer``) and commits every step
together with the events it caused, so a replay resumes at the first unfinished step.
Every delivery ends with a terminal event on the sink, however it ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import count
from typing import Any, Literal, TypeAlias

from .._errors import (
    ConfigurationError,
    FatalToolError,
    SessionOwnerError,
    SessionSuspendedError,
    StoreError,
)
from .._seams.sink import EventSink
from .._seams.store import NO_MESSAGES, NoHandle, SessionStore, StoreHandle, Transaction
from .._seams.tracer import (
    NO_SPAN,
    NO_TRACER,
    StepOutcome,
    StepSpan,
    StepTrace,
    TraceContext,
    Tracer,
    TurnSpan,
    TurnTrace,
)
from .._values.checkpoints import SuspendCheckpoint, ToolStepResult
from .._values.events import (
    ENDING_EVENT_TYPES,
    ActionCompletedEvent,
    ActionRequestedEvent,
    InputRequestedEvent,
    MessageCompletedEvent,
    MessageDeltaEvent,
    ReasoningDeltaEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnStartedEvent,
)
from .._values.inbound import InboundEvent
from .._values.inputs import InputRequest
from .._values.listed_tools import ListedTools
from .._values.messages import (
    AssistantMessage,
    Message,
    ModelReply,
    ToolCall,
    ToolMessage,
    TriggerMessage,
    UserMessage,
    message_from_dict,
)
from .._values.policy import TurnPolicy
from .._values.records import TurnRecord, TurnStatus
from .._values.step_ids import (
    model_step_id,
    policy_step_id,
    tool_step_id,
    tools_step_id,
    trace_step_id,
)
from .._values.turns import TurnCancelled, TurnFailure, TurnRequest, TurnResult, result_from_record
from .._values.usage import Usage, steps_usage
from .agent import Agent
from .batch import committed_results, distinct_ids, in_order
from .context import ChildTurns, ToolContext, TurnParked
from .context_window import ContextWindows, WindowCache
from .limits import calls_asked_before
from .model_call import Sent, ask_model
from .output import OUTPUT_TOOL, answer_tail, with_output
from .parallel import Asked, Outcome, Ran, run_batch
from .position import (
    CallModel,
    Finished,
    RunTools,
    count_model_steps,
    has_opening_message,
    next_step,
    stale_calls,
)
from .reset import carry_out_reset, runs_after_reset
from .tool_call import (
    ToolRaised,
    copy_input,
    fatal,
    input_error,
    run_local,
    run_remote,
    transient,
)
from .tool_results import error_result, error_text
from .tools import Tool
from .tracing import Traced, error_type, outcome_of
from .turn_tools import TurnTools, list_tool_sources

log = logging.getLogger("turnkit.engine")

#: Calls that are no tool call for ``Limits.tool_calls``: a typed answer's own.
_NOT_TOOLS = frozenset({OUTPUT_TOOL})

TurnStatusResult: TypeAlias = Literal["completed", "failed", "suspended", "cancelled"]

_REMOTE_HANDLE = NoHandle(
    "this tool is async (remote) and runs outside the step transaction; "
    "declare it with plain `def` to write through the store"
)
_NO_CONTEXT_HANDLE = NoHandle("this tool takes no context, so it has no store handle")
STALE_CALL_ERROR = "not run: the turn that asked for this call failed before it ran"
INTERRUPTED_CALL_ERROR = (
    "interrupted: the process running this call stopped before its result was saved; "
    "it may or may not have run, so check before retrying it"
)
SUPERSEDED_ERROR = "interrupted: a later turn started before it was recovered"


class KnownTranscript:
    """The transcript a session's last delivery ended with, kept so the next delivery
    reads only the messages committed since (positions are append-only within a
    generation, and committed messages never change)."""

    __slots__ = ("finished", "generation", "messages", "window")

    def __init__(self) -> None:
        self.messages: list[Message] | None = None
        self.generation = 0
        #: The turn that delivery ran, if it ended for good (completed or cancelled:
        #: states no redelivery can change), so the next opening need not look it up.
        self.finished: str | None = None
        #: The window the latest model step was sent under the history policy.
        self.window: WindowCache | None = None

    def forget(self) -> None:
        self.messages = None
        self.finished = None
        self.window = None


class TurnRunner:
    """Drives one delivery of one turn to its end. Create one per delivery."""

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
    ) -> None:
        self.agent = agent
        self.store = store
        self.sink = sink
        self.request = request
        self.children = children
        self.known = known
        self.turn_id = request.turn_id
        self.session_id = store.session_id
        self.event = request.event
        self.transcript: list[Message] = []
        self.steps: dict[str, Any] = {}
        self.next_seq = 1
        self.generation = 0
        self.store_id = ""
        self._durable_cancel: str | None = None
        self._opened = False
        #: Known not to be in the store: read as absent, opening commit not attempted
        #: yet (a failed commit may still have landed, so from then on it may be).
        self._unstored = False
        self.policy = TurnPolicy()
        self.tools = TurnTools(agent)
        self._known_finished: str | None = None
        self._record: TurnRecord | None = None
        self.tracer = tracer
        self._span: TurnSpan = NO_SPAN
        #: Whether the next step is the first a redelivery runs (see ``StepTrace``).
        self._resuming = False
        #: The error class of the failure the turn ends with, if it fails.
        self._failure: str | None = None
        #: What the turn's stored model calls used, in every delivery so far.
        self.usage = Usage()
        self._windows: ContextWindows | None = None

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
            self._emit(
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
            raise ConfigurationError(
                f"session {self.session_id} belongs to agent {snap.agent!r}, "
                f"not {self.agent.name!r}"
            )
        owner = self.request.owner
        if owner is not None and snap.agent is not None and snap.owner != owner:
            # Checked under the writer lock, so two first turns racing for a new
            # session cannot both claim it.
            refusal = (
                f"session {self.session_id} was not opened by {owner!r}; a turn for one "
                "owner cannot run in a session another owner (or code) opened"
            )
            if snap.turn is not None and snap.turn.status == "queued":
                return await self._settle_queued("failed", error=refusal)  # lost the race
            raise SessionOwnerError(refusal)
        self.transcript = [*prefix, *snap.messages]
        # Nothing was committed since our last delivery: its outcome is still current.
        self._known_finished = (
            known.finished if known is not None and prefix and not snap.messages else None
        )
        self.steps, self.next_seq = snap.steps, snap.next_seq
        self.usage = steps_usage(self.steps)
        self.generation, self.store_id = snap.generation, snap.store_id
        record = self._record = snap.turn
        if record is None and self.request.queued:
            # Submitted and stored, and gone before it could open: a reset archived it.
            return self._cancelled_unopened("reset")
        queued = record is not None and record.status == "queued"
        if record is not None:
            # A redelivery replays the turn as it was opened, whatever the caller passed.
            self.event = InboundEvent.from_dict(record.event) if record.event else None
            self._durable_cancel = record.cancel_reason
        self.policy = self._resolve_policy()
        self._resuming = record is not None and not queued
        trace = TurnTrace(
            session_id=self.session_id,
            turn_id=self.turn_id,
            agent=self.agent.name,
            replayed=self._resuming,
            origin=_trace_context(self.steps.get(trace_step_id(self.turn_id))),
            parent=self.request.trace,
        )
        with self.tracer.turn(trace) as span:
            self._span = span
            try:
                result = await self._deliver(record, queued)
            except BaseException as exc:
                span.broke(error_type(exc), error_text(exc))
                raise
            span.ended(result, self._failure)
            return result

    async def _deliver(self, record: TurnRecord | None, queued: bool) -> TurnResult:
        """The delivery once the turn's record is read: replay, open or announce it."""
        opened = record is not None and has_opening_message(self.transcript, self.turn_id)
        superseded = record is not None and not queued and not opened
        if record is not None and record.status == "suspended" and not superseded:
            reason = self._cancel_reason()
            if reason is not None:
                return await self._cancel(reason)  # a parked turn ends where it waits
        if record is not None and (
            record.status in ("completed", "suspended", "cancelled") or superseded
        ):
            # Finished, parked (no answer yet), or superseded by a later turn: nothing to
            # run, so say again how it ended (a parked turn re-announces its request).
            await self._announce_outcome()
            return result_from_record(record, self.usage)
        if queued and self._cancel_reason() is not None:
            return await self._settle_queued("cancelled", reason=self._cancel_reason())
        try:
            if record is None or queued:
                await self._open()
            elif record.status == "failed":
                await self._reopen(record)
            return await self._loop()
        except TurnFailure as failure:
            self._failure = error_type(failure)
            return await self._fail(str(failure))
        except _Park as park:
            return await self._park(park.requests)
        except TurnCancelled as cancelled:
            if not self._opened and queued:
                return await self._settle_queued("cancelled", reason=cancelled.reason)
            if not self._opened and record is None:
                return self._cancelled_unopened(cancelled.reason)
            return await self._cancel(cancelled.reason)
        except _Refused as refused:
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
        await self.store.commit(
            lambda tx: tx.settle_queued(self.turn_id, status, reason=reason, error=error)
        )
        if status == "cancelled":
            return self._cancelled_unopened(reason or "requested")
        message = error or "the turn could not open"
        self._emit(TurnFailedEvent(turn_id=self.turn_id, session_id=self.session_id, error=message))
        return TurnResult(turn_id=self.turn_id, status="failed", error=message)

    # -- cancellation ------------------------------------------------------------

    def _cancel_reason(self) -> str | None:
        """Why this turn is to stop, if it is: asked here, or recorded in the store."""
        return self.request.cancel.reason or self._durable_cancel

    def _boundary(self) -> None:
        """A checkpoint boundary: stop here if the turn was cancelled."""
        reason = self._cancel_reason()
        if reason is not None:
            raise TurnCancelled(reason)

    async def _step_boundary(self) -> None:
        """A boundary between steps: also stop if another process (or runtime) has
        recorded a cancellation of this turn since the delivery began."""
        await self._poll_cancel()
        self._boundary()

    async def _poll_cancel(self) -> str | None:
        """Why the turn is to stop, asking the store too unless it is known already."""
        if self._cancel_reason() is None:
            self._durable_cancel = await self.store.cancel_reason(self.turn_id)
        return self._cancel_reason()

    def _cancelled_unopened(self, reason: str) -> TurnResult:
        """Cancelled before its opening committed: nothing is stored, observers are told."""
        self._emit(
            TurnCancelledEvent(turn_id=self.turn_id, session_id=self.session_id, reason=reason)
        )
        return TurnResult(turn_id=self.turn_id, status="cancelled", reason=reason)

    async def _cancel(self, reason: str) -> TurnResult:
        """End the turn ``cancelled`` in one commit. Calls of the current batch that had
        not run get a synthetic result, so the transcript stays valid for the next
        model call; no ``action.completed`` is emitted for them."""
        step = next_step(self.transcript, self.turn_id)
        owed: Sequence[ToolCall] = step.owed if isinstance(step, RunTools) else ()
        index = len(self.transcript)
        assistant_index = step.assistant_index if isinstance(step, RunTools) else 0
        # Calls of the batch whose result committed (they finished) keep it.
        kept = committed_results(assistant_index, owed, self.steps, self.turn_id)
        result = {"cancelled": True, "reason": reason}
        messages = [
            kept.get(c.id)
            or ToolMessage(
                call_id=c.id, name=c.name, result=dict(result), turn_id=self.turn_id, is_error=True
            )
            for c in owed
        ]

        def write(tx: Transaction) -> None:
            for offset, (call, message) in enumerate(zip(owed, messages, strict=True)):
                if call.id not in kept:
                    stored = ToolStepResult(result=message.result, error=f"cancelled: {reason}")
                    step_id = tool_step_id(assistant_index, call.id)
                    tx.put_step(step_id, self.turn_id, stored.to_dict())
                tx.append_message(index + offset, message)
            tx.request_cancel(self.turn_id, reason)
            tx.set_turn_status(self.turn_id, "cancelled")

        event = TurnCancelledEvent(
            turn_id=self.turn_id, session_id=self.session_id, reason=reason, seq=self.next_seq
        )
        await self._commit(write, [event], messages)
        return self._result("cancelled", reason=reason)

    async def _list_tools(self) -> None:
        """The tools the turn's sources listed: stored with the turn the first time it
        runs (before its first model step), read back on every later delivery."""
        step_id = tools_step_id(self.turn_id)
        stored = self.steps.get(step_id)
        if stored is None and not self.agent.tool_sources:
            return
        if stored is None:
            listed = await list_tool_sources(self.agent)
            row = listed.to_dict()

            def write(tx: Transaction) -> None:
                tx.put_step(step_id, self.turn_id, row)

            await self._commit(write, [])
            self.steps[step_id] = row
        else:
            listed = ListedTools.from_dict(stored)
        self.tools = TurnTools(self.agent, listed)

    async def _loop(self) -> TurnResult:
        await self._list_tools()
        limits, name = self.agent.limits, self.agent.name
        taken = count_model_steps(self.transcript, self.turn_id) if limits.model_steps else 0
        while True:
            step = next_step(self.transcript, self.turn_id)
            if isinstance(step, CallModel):
                await self._step_boundary()
                limits.check_model_call(name, taken, self.usage)
                await self._model_step(step.index)
                taken += 1
            elif isinstance(step, RunTools):
                if limits.tool_calls is not None:
                    self._check_tool_batch(step)
                await self._tool_batch(step)
            elif isinstance(step, Finished):
                return self._result("completed", text=step.text)
            else:
                raise StoreError(f"turn {self.turn_id}: opening message missing after commit")

    # -- commits and events ------------------------------------------------------

    async def _commit(
        self,
        write: Callable[[Transaction], None],
        events: list[TurnEvent],
        messages: Sequence[Message] = (),
    ) -> None:
        """Commit ``write`` plus ``events`` (numbered from ``next_seq`` by the caller);
        only then extend the transcript and emit."""

        def work(tx: Transaction) -> None:
            write(tx)
            for event in events:
                tx.log_event(event)

        await self.store.commit(work)
        self.next_seq += len(events)
        self.transcript.extend(messages)
        for event in events:
            self._emit(event)

    def _emit(self, event: TurnEvent) -> None:
        try:
            self.sink.emit(event)
        except Exception:
            log.exception("event sink raised on %s; ignored", event.type)

    async def _announce_outcome(self) -> None:
        """Re-emit the logged ending (terminal, or the park) of a turn with nothing to run."""
        logged = await self.store.events(turn_id=self.turn_id)
        for event in reversed(logged):
            if event.type in ENDING_EVENT_TYPES:
                self._emit(event)
                return
        # Settled while queued: it never opened, so nothing was logged; say it live.
        record, sid = self._record, self.session_id
        if record is not None and record.status == "cancelled":
            reason = record.cancel_reason or "requested"
            self._emit(TurnCancelledEvent(turn_id=self.turn_id, session_id=sid, reason=reason))
        elif record is not None and record.status == "failed":
            error = record.error or "failed"
            self._emit(TurnFailedEvent(turn_id=self.turn_id, session_id=sid, error=error))

    # -- opening, retry, failure -------------------------------------------------

    async def _open(self) -> None:
        queued = self._record is not None and self._record.status == "queued"
        opening = self.request.opening
        if queued:
            assert self._record is not None
            stored = message_from_dict(self._record.opening)  # as submitted, whoever delivers
            if isinstance(stored, UserMessage | TriggerMessage):
                opening = stored
        # The turn before ours, if a crash left it open, ends here: ours supersedes it.
        previous = self.transcript[-1].turn_id if self.transcript else None
        if previous is None or previous == self._known_finished:
            stale = None  # none, or the turn our last delivery ended for good
        else:
            stale = await self.store.turn(previous)
        if stale is not None and stale.status == "suspended":
            refusal = (
                f"session {self.session_id} is waiting for input on turn {stale.turn_id}; "
                "resume it (or reset the session) before starting another turn"
            )
            if queued:  # submitted while the park was on its way: it ends here, for good
                raise _Refused(refusal)
            raise SessionSuspendedError(refusal)
        crashed = stale if stale is not None and stale.status == "running" else None
        closing = await self._closing_results(
            INTERRUPTED_CALL_ERROR if crashed else STALE_CALL_ERROR
        )
        record = TurnRecord(
            session_id=self.session_id,
            turn_id=self.turn_id,
            agent=self.agent.name,
            status="running",
            opening=opening.to_dict(),
            event=self.event.to_dict() if self.event else None,
            created_at=time.time(),
        )
        seq = count(self.next_seq)
        sid = self.session_id
        events: list[TurnEvent] = [
            ActionCompletedEvent(
                turn_id=m.turn_id,
                session_id=sid,
                call_id=m.call_id,
                name=m.name,
                result=copy_input(m.result),
                error=m.result["error"],
                seq=next(seq),
            )
            for step_id, m in closing
            if step_id is not None
        ]
        if crashed is not None:
            events.append(
                TurnFailedEvent(
                    turn_id=crashed.turn_id, session_id=sid, error=SUPERSEDED_ERROR, seq=next(seq)
                )
            )
        events.append(
            TurnStartedEvent(turn_id=self.turn_id, session_id=sid, text=opening.text, seq=next(seq))
        )
        index = len(self.transcript)
        policy = self.policy.to_dict()
        stored_trace = trace_step_id(self.turn_id) in self.steps
        context = None if stored_trace else self._span.context()
        self._boundary()  # the last moment a cancellation leaves no trace

        def write(tx: Transaction) -> None:
            for offset, (step_id, msg) in enumerate(closing):
                if step_id is not None:
                    stored = ToolStepResult(result=msg.result, error=msg.result["error"])
                    tx.put_step(step_id, msg.turn_id, stored.to_dict())
                tx.append_message(index + offset, msg)
            if crashed is not None:
                tx.set_turn_status(crashed.turn_id, "failed", error=SUPERSEDED_ERROR)
            tx.append_message(index + len(closing), opening)
            tx.open_turn(record, owner=self.request.owner)
            if policy_step_id(self.turn_id) not in self.steps:  # a queued turn has it
                tx.put_step(policy_step_id(self.turn_id), self.turn_id, policy)
            if context:  # the trace later deliveries of this turn refer to
                tx.put_step(trace_step_id(self.turn_id), self.turn_id, context)

        self._unstored = False
        await self._commit(write, events, [m for _, m in closing] + [opening])
        self._opened = True

    async def _closing_results(self, reason: str) -> list[tuple[str | None, ToolMessage]]:
        """Results for the calls an earlier turn left unanswered at the tail: the ones
        it committed (a call of a parallel batch that finished), else an error, with
        the step id to store it under (``None``: stored already)."""
        stale = stale_calls(self.transcript, self.turn_id)
        if stale is None:
            return []
        index, calls = stale
        owner = self.transcript[index].turn_id
        steps = (await self.store.load(owner, from_index=NO_MESSAGES)).steps
        kept = committed_results(index, calls, steps, owner)
        return [
            (None, kept[c.id])
            if c.id in kept
            else (
                tool_step_id(index, c.id),
                ToolMessage(
                    call_id=c.id,
                    name=c.name,
                    result=error_result(reason),
                    turn_id=owner,
                    is_error=True,
                ),
            )
            for c in calls
        ]

    async def _reopen(self, record: TurnRecord) -> None:
        def write(tx: Transaction) -> None:
            tx.set_turn_status(self.turn_id, "running")

        text = str(record.opening.get("text", ""))
        started = TurnStartedEvent(
            turn_id=self.turn_id, session_id=self.session_id, text=text, seq=self.next_seq
        )
        await self._commit(write, [started])

    async def _fail(self, error: str) -> TurnResult:
        def write(tx: Transaction) -> None:
            tx.set_turn_status(self.turn_id, "failed", error=error)

        failed = TurnFailedEvent(
            turn_id=self.turn_id, session_id=self.session_id, error=error, seq=self.next_seq
        )
        await self._commit(write, [failed])
        return self._result("failed", error=error)

    async def _park(self, asked: tuple[InputRequest, ...]) -> TurnResult:
        """Write the one suspend checkpoint: the requests (one per call that asked)
        and what a resume in another process needs to replay the turn as it was
        opened."""
        requests = distinct_ids(asked)
        first = requests[0]
        # The stored opening (a redelivery may have been started with other text).
        opening = self._record.opening if self._record else self.request.opening.to_dict()
        checkpoint = SuspendCheckpoint(
            request=first,
            call_id=first.call_id,
            opening_text=str(opening.get("text", "")),
            event=self.event,
            policy=self.policy,
            generation=self.generation,
            requests=requests,
        ).to_dict()

        def write(tx: Transaction) -> None:
            tx.set_turn_status(self.turn_id, "suspended", pending=checkpoint)

        event = InputRequestedEvent(
            turn_id=self.turn_id,
            session_id=self.session_id,
            request=first,
            requests=requests,
            seq=self.next_seq,
        )
        await self._commit(write, [event])
        return self._result("suspended", request=first, requests=requests)

    def _result(self, status: TurnStatusResult, **outcome: Any) -> TurnResult:
        """How this delivery ends the turn, with what the turn's model calls used."""
        return TurnResult(turn_id=self.turn_id, status=status, usage=self.usage, **outcome)

    # -- model steps -------------------------------------------------------------

    def _step_trace(self, step_id: str, **what: Any) -> StepTrace:
        resuming, self._resuming = self._resuming, False
        return StepTrace(step_id=step_id, replayed=resuming, **what)

    async def _model_step(self, index: int) -> None:
        # A step's result commits with its message, so this step was never answered.
        step_id = model_step_id(index)
        # The history policy's summary calls are steps of their own, with spans of
        # their own, made before this step's request (and its span) begins.
        windows = self._context_windows()
        sent = await windows.prepare(self.transcript, index, self.policy.system)
        self.usage = self.usage + windows.take_usage()  # summaries it made
        with Traced(self._span.step(self._step_trace(step_id, model=self.agent.model))) as span:
            await self._ask_and_commit(index, step_id, span, windows, sent)

    def _traced_summary(self, step_id: str, model: Any) -> Traced:
        """The span of a summary call the history policy makes (step ``step_id``)."""
        return Traced(self._span.step(self._step_trace(step_id, model=model)))

    async def _ask_and_commit(
        self, index: int, step_id: str, span: StepSpan, windows: ContextWindows, sent: Sent
    ) -> None:
        reply = await ask_model(
            self.agent,
            sent,
            self._text_delta,
            self._reasoning_delta,
            self._cancel_reason,
            tools=self.tools.specs_for(self.policy),
        )
        span.replied(reply)
        message = _assistant(reply, self.turn_id, reply.tool_calls)
        # What follows the reply in the same commit (a typed answer's result, or a
        # refused one's error), and the turn's answer if this step ends it.
        tail, answer = answer_tail(
            self.agent._output,
            reply,
            self.transcript,
            self.turn_id,
            self.agent.model,
        )
        tid, sid, seq = self.turn_id, self.session_id, count(self.next_seq)
        # Observers may mutate what they get; the transcript must not change with it.
        shown = _assistant(reply, tid, _detached(reply.tool_calls)) if reply.tool_calls else message
        events: list[TurnEvent] = [
            MessageCompletedEvent(turn_id=tid, session_id=sid, message=shown, seq=next(seq))
        ]
        events += [
            ActionRequestedEvent(turn_id=tid, session_id=sid, call=c, seq=next(seq))
            for c in shown.tool_calls
        ]
        events += [e for m in tail if (e := self._tail_event(m, next(seq))) is not None]
        if answer is not None:
            completed = TurnCompletedEvent(turn_id=tid, session_id=sid, text=answer, seq=next(seq))
            events.append(completed)

        def write(tx: Transaction) -> None:
            # Part of the commit: a cancel that arrived after the last delta or while
            # the stream closed still wins (nothing of the step is written).
            self._boundary()
            tx.put_step(step_id, self.turn_id, reply.to_dict())
            windows.write(tx)
            tx.append_message(index, message)
            for offset, later in enumerate(tail, start=1):
                if isinstance(later, ToolMessage):
                    stored = ToolStepResult(result=later.result, error=_error_of(later))
                    tx.put_step(tool_step_id(index, later.call_id), tid, stored.to_dict())
                tx.append_message(index + offset, later)
            if answer is not None:
                tx.set_turn_status(self.turn_id, "completed", text=answer)

        await self._commit(write, events, [message, *tail])
        cache = windows.committed()
        if self.known is not None:
            self.known.window = cache
        if reply.usage is not None:
            self.usage = self.usage + reply.usage

    def _context_windows(self) -> ContextWindows:
        """This delivery's use of the agent's history policy (made on first use)."""
        if self._windows is None:
            self._windows = ContextWindows(
                agent=self.agent,
                store=self.store,
                turn_id=self.turn_id,
                generation=self.generation,
                steps=self.steps,
                cache=self.known.window if self.known is not None else None,
                boundary=self._step_boundary,
                cancelled=self._cancel_reason,
                traced=self._traced_summary,
            )
        return self._windows

    def _tail_event(self, message: Message, seq: int) -> TurnEvent | None:
        """The event for a message a model step commits after its reply, if any."""
        tid, sid = self.turn_id, self.session_id
        if isinstance(message, ToolMessage):
            return ActionCompletedEvent(
                turn_id=tid,
                session_id=sid,
                call_id=message.call_id,
                name=message.name,
                result=copy_input(message.result),
                error=_error_of(message),
                seq=seq,
            )
        if isinstance(message, AssistantMessage):
            return MessageCompletedEvent(turn_id=tid, session_id=sid, message=message, seq=seq)
        return None  # the feedback on a refused text answer: in the transcript only

    def _text_delta(self, text: str) -> None:
        self._emit(
            MessageDeltaEvent(
                turn_id=self.turn_id, session_id=self.session_id, text=text, next_seq=self.next_seq
            )
        )

    def _reasoning_delta(self, text: str) -> None:
        self._emit(
            ReasoningDeltaEvent(
                turn_id=self.turn_id, session_id=self.session_id, text=text, next_seq=self.next_seq
            )
        )

    # -- tool steps --------------------------------------------------------------

    def _context(self, handle: Any, call: ToolCall, step_id: str, *, local: bool) -> ToolContext:
        return ToolContext(
            store=handle,
            agent=self.agent,
            session_id=self.session_id,
            turn_id=self.turn_id,
            call_id=call.id,
            event=self.event,
            children=self.children,
            step_id=step_id,
            generation=self.generation,
            store_id=self.store_id,
            tool_name=call.name,
            source=self.policy.source,
            denied_tools=self.policy.deny_tools,
            _steps=self.steps,
            _local=local,
        )

    def _check_tool_batch(self, step: RunTools) -> None:
        """Fail the turn before a batch that would take it past its tool-call limit
        (a typed answer's own call is no tool call)."""
        index = step.assistant_index
        message = self.transcript[index]
        calls = message.tool_calls if isinstance(message, AssistantMessage) else ()
        batch = sum(1 for c in calls if c.name not in _NOT_TOOLS)
        before = calls_asked_before(self.transcript, self.turn_id, index, skip=_NOT_TOOLS)
        self.agent.limits.check_tool_batch(self.agent.name, before, batch)

    async def _tool_batch(self, step: RunTools) -> None:
        """Run the calls the batch still owes a result, in parallel when the agent
        allows it (``max_parallel_tools``); a result committed before (the call
        finished ahead of an earlier one, then the process stopped) is not run again."""
        index, owed = step.assistant_index, step.owed
        if tool_step_id(index, owed[0].id) in self.steps:
            await self._take_committed(step)  # its message was never appended
            return
        todo = [c for c in owed if tool_step_id(index, c.id) not in self.steps]
        limit = self.agent.max_parallel_tools
        if limit > 1 and len(todo) > 1:
            asked = await run_batch(_BatchSteps(self, index), todo, limit)
            if asked:
                raise _Park(tuple(request for _, request in asked))
            return
        for call in todo:
            await self._step_boundary()
            await self._tool_step(index, call)

    async def _take_committed(self, step: RunTools) -> None:
        """Append the committed results at the head of the batch to the transcript."""
        held = committed_results(step.assistant_index, step.owed, self.steps, self.turn_id)
        ready = in_order(step.owed, held)
        index = len(self.transcript)

        def write(tx: Transaction) -> None:
            for offset, message in enumerate(ready):
                tx.append_message(index + offset, message)

        await self._commit(write, [], ready)

    def _allowed_tool(self, call: ToolCall) -> Tool | None:
        """The call's tool; a tool the turn's policy denies is as unknown as one the
        agent never had."""
        return self.tools.tool(call.name) if self.policy.allows(call.name) else None

    def _remote_tool(self, call: ToolCall) -> Tool | None:
        """The call's tool if it is ``async def`` and will run (allowed, input read)."""
        tool = self._allowed_tool(call)
        if tool is None or tool.local or input_error(call) is not None:
            return None
        return tool

    async def _tool_step(self, assistant_index: int, call: ToolCall) -> None:
        step_id = tool_step_id(assistant_index, call.id)
        with Traced(self._span.step(self._step_trace(step_id, call=call))) as span:
            await self._run_tool(step_id, call, span)

    async def _run_tool(self, step_id: str, call: ToolCall, span: StepSpan) -> None:
        tool = self._allowed_tool(call)
        problem = input_error(call)
        if problem is not None or tool is None:
            text = problem or f"unknown tool: {call.name}"
            kind = "invalid_input" if problem is not None else "unknown_tool"
            span.ended(StepOutcome(status="failed", error_type=kind, message=text))
            await self._commit_tool(step_id, call, error_result(text), text)
        elif tool.local:
            await self._local_tool_step(tool, step_id, call, span)
        else:
            outcome = await self._run_remote(tool, step_id, call, span)
            if isinstance(outcome, Asked):
                raise _Park((outcome.request,))
            await self._commit_tool(step_id, call, outcome.value, outcome.error)

    async def _run_remote(
        self, tool: Tool, step_id: str, call: ToolCall, span: StepSpan
    ) -> Outcome:
        """Await a remote tool; what it returned, or the question it asked."""
        ctx = self._context(_REMOTE_HANDLE, call, step_id, local=False)
        try:
            result, raised = await run_remote(tool, copy_input(call.input), ctx)
        except TurnParked as parked:
            span.ended(StepOutcome(status="parked"))
            return Asked(parked.request)
        if raised is not None:
            span.ended(outcome_of(raised))
        return Ran(result, error_text(raised) if raised is not None else None)

    async def _local_tool_step(
        self, tool: Tool, step_id: str, call: ToolCall, span: StepSpan
    ) -> None:
        """Run a ``def`` tool inside the very commit that records what it returned (off
        the event loop: see ``SessionStore.commit``)."""
        index, seq = len(self.transcript), self.next_seq
        handles: list[StoreHandle] = []

        def work(tx: Transaction) -> _Written:
            # Asking for the handle, before anything else, tells the store that this
            # work runs tool code, which may block: it runs it off the event loop.
            handle = tx.handle
            # Only a tool that can see ctx.store is handed it.
            given = handle if tool.needs_store else _NO_CONTEXT_HANDLE
            handles.append(handle)  # (it also tells a passing database failure apart)
            ctx = self._context(given, call, step_id, local=True)
            value = run_local(tool, copy_input(call.input), ctx)
            return self._write_tool(tx, _ToolRow(index, seq, step_id, call, value, None))

        try:
            written = await self.store.commit(work)
        except ToolRaised as raised:
            # The transaction rolled back, undoing the tool's own writes.
            if handles and transient(handles[-1], raised.original):
                raise StoreError(
                    f"turn {self.turn_id}: tool {tool.name!r} hit a passing database "
                    f"failure ({error_text(raised.original)}); the step was not recorded: "
                    "deliver the turn again"
                ) from raised.original
            # The tool's own exception: its error result.
            span.ended(outcome_of(raised.original))
            text = error_text(raised.original)
            await self._commit_tool(step_id, call, error_result(text), text)
            return
        except FatalToolError as exc:
            raise fatal(tool, exc) from exc
        self._after_tool(written)

    async def _commit_tool(
        self, step_id: str, call: ToolCall, value: Any, error: str | None
    ) -> None:
        """Commit a tool step whose result is already known."""
        row = _ToolRow(len(self.transcript), self.next_seq, step_id, call, value, error)

        def work(tx: Transaction) -> _Written:
            return self._write_tool(tx, row)

        self._after_tool(await self.store.commit(work))

    def _write_tool(self, tx: Transaction, row: _ToolRow) -> _Written:
        """The rows of one tool step: its memo, its ``action.completed``, and its tool
        message with those of the calls after it that were waiting for it (the
        transcript keeps the order the model asked in)."""
        call = row.call
        message = ToolMessage(
            call_id=call.id,
            name=call.name,
            result=row.value,
            turn_id=self.turn_id,
            is_error=row.error is not None,
        )
        event = ActionCompletedEvent(
            turn_id=self.turn_id,
            session_id=self.session_id,
            call_id=call.id,
            name=call.name,
            result=copy_input(row.value),  # observers get their own copy to mutate
            error=row.error,
            seq=row.seq,
        )
        stored = ToolStepResult(result=row.value, error=row.error).to_dict()
        tx.put_step(row.step_id, self.turn_id, stored)
        ready = self._ready_after(call, message)
        for offset, ready_message in enumerate(ready):
            tx.append_message(row.index + offset, ready_message)
        tx.log_event(event)
        return _Written(row.step_id, stored, ready, event)

    def _ready_after(self, call: ToolCall, message: ToolMessage) -> list[ToolMessage]:
        """The messages that join the transcript once ``call``'s result commits."""
        step = next_step(self.transcript, self.turn_id)
        if not isinstance(step, RunTools):
            return [message]
        held = committed_results(step.assistant_index, step.owed, self.steps, self.turn_id)
        held[call.id] = message
        return in_order(step.owed, held)

    def _after_tool(self, written: _Written) -> None:
        self.steps[written.step_id] = written.stored
        self.next_seq += 1
        self.transcript.extend(written.messages)
        self._emit(written.event)


class _BatchSteps:
    """The runner's side of ``run_batch``, for the calls of one assistant message."""

    def __init__(self, runner: TurnRunner, assistant_index: int) -> None:
        self._runner = runner
        self._index = assistant_index

    def runs_remote(self, call: ToolCall) -> bool:
        return self._runner._remote_tool(call) is not None

    async def remote(self, call: ToolCall) -> Outcome:
        runner = self._runner
        tool = runner._remote_tool(call)
        assert tool is not None  # (only calls runs_remote admitted come here)
        step_id = tool_step_id(self._index, call.id)
        # The span covers the tool's run; its result commits from the batch's driver.
        with Traced(runner._span.step(runner._step_trace(step_id, call=call))) as span:
            return await runner._run_remote(tool, step_id, call, span)

    async def commit_remote(self, call: ToolCall, ran: Ran) -> None:
        step_id = tool_step_id(self._index, call.id)
        await self._runner._commit_tool(step_id, call, ran.value, ran.error)

    async def run_here(self, call: ToolCall) -> None:
        await self._runner._tool_step(self._index, call)

    async def cancel_reason(self) -> str | None:
        return await self._runner._poll_cancel()


class _Refused(Exception):
    """Internal: a queued turn cannot open (the session parked before it ran)."""


def opening_policy(agent: Agent, request: TurnRequest, event: InboundEvent | None) -> TurnPolicy:
    """The policy a new turn opens with: its agent's for the turn's source, plus the
    tools it inherited denied (a child turn gets its parent's denials)."""
    source = event.source if event is not None else request.source
    policy = agent.policy_for(source)
    if request.inherited_deny:
        policy = replace(policy, deny_tools=policy.deny_tools | request.inherited_deny)
    return policy


class _Park(Exception):
    """Internal: remote tools asked for input; the turn parks on their requests (in
    the order of the calls that asked)."""

    def __init__(self, requests: tuple[InputRequest, ...]) -> None:
        super().__init__(", ".join(r.id for r in requests))
        self.requests = requests


@dataclass(frozen=True)
class _Written:
    """What one tool step committed: its memo, the messages that joined the
    transcript with it (its own, maybe with later calls' or none yet), its event."""

    step_id: str
    stored: Any
    messages: list[ToolMessage]
    event: ActionCompletedEvent


@dataclass(frozen=True)
class _ToolRow:
    """Everything one tool step commits, positioned in the transcript and the event log."""

    index: int
    seq: int
    step_id: str
    call: ToolCall
    value: Any
    error: str | None


def _assistant(reply: ModelReply, turn_id: str, calls: tuple[ToolCall, ...]) -> AssistantMessage:
    return AssistantMessage(
        text=reply.text,
        turn_id=turn_id,
        tool_calls=calls,
        stop=reply.stop,
        provider_state=reply.provider_state,
        usage=reply.usage,
    )


def _error_of(message: ToolMessage) -> str | None:
    """The error text of an error result the engine made (``{"error": text}``)."""
    if not message.is_error or not isinstance(message.result, dict):
        return None
    return str(message.result.get("error", ""))


def _detached(calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    """Copies of ``calls`` whose inputs are not shared with the transcript."""
    return tuple(
        ToolCall(
            id=c.id,
            name=c.name,
            input=copy_input(c.input),
            provider_state=copy_input(c.provider_state),
        )
        for c in calls
    )


def _trace_context(stored: object) -> TraceContext | None:
    """A stored trace context, or ``None`` if there is none (or it is not one)."""
    if isinstance(stored, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in stored.items()
    ):
        return dict(stored)
    return None
