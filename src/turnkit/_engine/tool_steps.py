"""Tool steps: run the calls a model asked for and commit each result with its rows.

A ``def`` tool runs inside the very transaction that records its result, so its own
writes and its step commit or vanish together; an ``async def`` (remote) tool runs
outside it and its result commits afterwards. ``ToolSteps`` is the runner's
collaborator for every ``RunTools`` step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from pydantic_core import to_json

from .._errors import FatalToolError, StoreError
from .._seams.store import NoHandle, StoreHandle
from .._seams.tracer import StepOutcome, StepSpan
from .._values.events import ActionCompletedEvent
from .._values.frozen import made_clean
from .._values.inputs import InputRequest
from .._values.listed_tools import ListedTools
from .._values.messages import AssistantMessage, ToolCall, ToolMessage
from .._values.step_ids import tool_step_id, tools_step_id
from .._values.text import storable, storable_json
from .._values.writes import AppendMessage, LogEvent, PutStep, Write
from .batch import committed_results, in_order
from .context import ToolContext, TurnParked
from .delivery import Delivery
from .limits import calls_asked_before
from .output import OUTPUT_TOOL
from .parallel import Asked, Outcome, Ran, run_batch
from .position import RunTools, next_step
from .retries import retry_wait
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
from .tracing import UNTRACED, UNTRACED_SPAN, outcome_of
from .turn_tools import TurnTools, list_tool_sources
from .version_meeting import rewritten

#: Calls that are no tool call for ``Limits.tool_calls``: a typed answer's own.
_NOT_TOOLS = frozenset({OUTPUT_TOOL})
#: A tool step's event and memo, made from its message's (already storable) fields.
_completed = made_clean(ActionCompletedEvent)

_REMOTE_HANDLE = NoHandle(
    "this tool is async (remote) and runs outside the step transaction; "
    "declare it with plain `def` to write through the store"
)
_NO_CONTEXT_HANDLE = NoHandle("this tool takes no context, so it has no store handle")


class Park(Exception):
    """Remote tools asked for input; the turn parks on their requests (in the order
    of the calls that asked)."""

    def __init__(self, requests: tuple[InputRequest, ...]) -> None:
        super().__init__(", ".join(r.id for r in requests))
        self.requests = requests


class ToolSteps:
    """The tools of one delivery: which the turn has, and running the calls of its
    batches with their results committed."""

    def __init__(self, delivery: Delivery) -> None:
        self._d = delivery
        #: The fields every call's ``ToolContext`` shares (see ``_shared``).
        self._shared_fields: dict[str, Any] | None = None

    async def list_tools(self) -> None:
        """The tools the turn's sources listed: stored with the turn the first time it
        runs (before its first model step), read back on every later delivery."""
        d = self._d
        step_id = tools_step_id(d.turn_id)
        stored = d.steps.get(step_id)
        if stored is None and not d.agent.tool_sources:
            return
        if stored is None:
            listed = await list_tool_sources(d.agent)
            row = listed.to_dict()
            await d.commit([PutStep(step_id, d.turn_id, row)], [])
            d.remember(step_id, row)
        else:
            listed = ListedTools.from_dict(stored)
        d.use_tools(TurnTools(d.agent, listed))

    def check_limit(self, step: RunTools) -> None:
        """Fail the turn before a batch that would take it past its tool-call limit
        (a typed answer's own call is no tool call)."""
        d = self._d
        index = step.assistant_index
        message = d.transcript[index]
        calls = message.tool_calls if isinstance(message, AssistantMessage) else ()
        batch = sum(1 for c in calls if c.name not in _NOT_TOOLS)
        before = calls_asked_before(d.transcript, d.turn_id, index, skip=_NOT_TOOLS)
        d.agent.limits.check_tool_batch(d.agent.name, before, batch)

    async def run(self, step: RunTools) -> None:
        """Run the calls the batch still owes a result, in parallel when the agent
        allows it (``max_parallel_tools``); a result committed before (the call
        finished ahead of an earlier one, then the process stopped) is not run again."""
        d = self._d
        index, owed = step.assistant_index, step.owed
        steps = d.steps
        if tool_step_id(index, owed[0].id) in steps:
            await self._take_committed(step)  # its message was never appended
            return
        todo: list[tuple[str, ToolCall]] = []
        for c in owed:  # (a loop, not a comprehension: no frame of its own, every batch)
            step_id = tool_step_id(index, c.id)
            if step_id not in steps:
                todo.append((step_id, rewritten(d, c)))
        limit = d.agent.max_parallel_tools
        if limit > 1 and len(todo) > 1:
            asked = await run_batch(_BatchSteps(self, index), [c for _, c in todo], limit)
            if asked:
                raise Park(tuple(request for _, request in asked))
            return
        for step_id, call in todo:
            await d.step_boundary()
            await self.step(step_id, call)

    async def _take_committed(self, step: RunTools) -> None:
        """Append the committed results at the head of the batch to the transcript."""
        d = self._d
        held = committed_results(step.assistant_index, step.owed, d.steps, d.turn_id)
        ready = in_order(step.owed, held)
        index = len(d.transcript)
        writes = [AppendMessage(index + offset, m) for offset, m in enumerate(ready)]
        await d.commit(writes, [], ready)

    def _context(self, handle: Any, call: ToolCall, step_id: str, *, local: bool) -> ToolContext:
        """A call's context: the delivery's shared fields and the call's own. (Made
        without its ``__init__``, which would only store them: it checks nothing.)"""
        shared = self._shared()
        ctx: ToolContext = object.__new__(ToolContext)
        vars(ctx).update(
            shared,
            store=handle,
            call_id=call.id,
            step_id=step_id,
            tool_name=call.name,
            _local=local,
            _note=None if local else shared["_note"],
            _waits=[0],
        )
        return ctx

    def _shared(self) -> dict[str, Any]:
        """What every call's context of this delivery holds, in ``ToolContext``'s field
        order: the same for each call, so read from the delivery once (on the first
        call, when the delivery has loaded the turn) rather than field by field for
        every call."""
        if self._shared_fields is None:
            d = self._d
            shared = ToolContext(
                store=_REMOTE_HANDLE,
                agent=d.agent,
                session_id=d.session_id,
                turn_id=d.turn_id,
                call_id="",
                event=d.event,
                children=d.children,
                step_id="",
                generation=d.generation,
                store_id=d.store_id,
                source=d.policy.source,
                denied_tools=d.policy.deny_tools,
                tenant=d.tenant,
                _steps=d.steps,
                _note=self._noter(),
            )
            self._shared_fields = dict(vars(shared))
        return self._shared_fields

    def _noter(self) -> Callable[[str, Any], Awaitable[None]]:
        """How a remote call's ``ctx.remember`` commits: one memo row, on its own."""
        d = self._d

        async def note(step_id: str, value: Any) -> None:
            stored = storable_json(value)
            try:
                to_json(stored)
            except ValueError as exc:
                raise FatalToolError(f"ctx.remember: the value is not JSON: {exc}") from None
            await d.commit([PutStep(step_id, d.turn_id, stored)], [])
            d.remember(step_id, stored)

        return note

    def _allowed_tool(self, call: ToolCall) -> Tool | None:
        """The call's tool; a tool the turn's policy denies is as unknown as one the
        agent never had."""
        d = self._d
        return d.tools.tool(call.name) if d.policy.allows(call.name) else None

    def remote_tool(self, call: ToolCall) -> Tool | None:
        """The call's tool if it is ``async def`` and will run (allowed, input read)."""
        tool = self._allowed_tool(call)
        if tool is None or tool.local or input_error(call) is not None:
            return None
        return tool

    async def step(self, step_id: str, call: ToolCall) -> None:
        """One call's step (``step_id``), from its run to its commit, under its own span."""
        traced = self._d.step_span(step_id, call=call)
        if traced is UNTRACED:
            await self._run_tool(step_id, call, UNTRACED_SPAN)
            return
        with traced as span:
            await self._run_tool(step_id, call, span)

    async def _run_tool(self, step_id: str, call: ToolCall, span: StepSpan) -> None:
        tool = self._allowed_tool(call)
        problem = input_error(call)
        if problem is not None or tool is None:
            text = problem or f"unknown tool: {call.name}"
            kind = "invalid_input" if problem is not None else "unknown_tool"
            span.ended(StepOutcome(status="failed", error_type=kind, message=text))
            await self.commit_result(step_id, call, error_result(text), text)
        elif tool.local:
            await self._local_tool_step(tool, step_id, call, span)
        else:
            outcome = await self.run_remote(tool, step_id, call, span)
            if isinstance(outcome, Asked):
                raise Park((outcome.request,))
            await self.commit_result(step_id, call, outcome.value, outcome.error)

    async def run_remote(self, tool: Tool, step_id: str, call: ToolCall, span: StepSpan) -> Outcome:
        """Await a remote tool; what it returned, or the question it asked."""
        ctx = self._context(_REMOTE_HANDLE, call, step_id, local=False)
        try:
            result, raised = await run_remote(tool, copy_input(call.input), ctx)
        except TurnParked as parked:
            span.ended(StepOutcome(status="parked"))
            return Asked(parked.request)
        if raised is not None:
            span.ended(outcome_of(raised))
            wait = retry_wait(tool.retry, raised, ctx, self._d.steps)
            if wait is not None:
                return Asked(wait)  # parked until the next attempt's time
        return Ran(result, error_text(raised) if raised is not None else None)

    async def _local_tool_step(
        self, tool: Tool, step_id: str, call: ToolCall, span: StepSpan
    ) -> None:
        """Run a ``def`` tool inside the very commit that records what it returned (off
        the event loop: see ``SessionStore.commit``)."""
        d = self._d
        index, seq = len(d.transcript), d.next_seq
        handles: list[StoreHandle] = []

        def step(handle: StoreHandle) -> tuple[_Written, list[Write]]:
            # Off the event loop, in the step's transaction (see ``run_tool``).
            # Only a tool that can see ctx.store is handed it.
            given = handle if tool.needs_store else _NO_CONTEXT_HANDLE
            handles.append(handle)  # (it also tells a passing database failure apart)
            ctx = self._context(given, call, step_id, local=True)
            value = run_local(tool, copy_input(call.input), ctx)
            return self._written(index, seq, step_id, call, value, None)

        try:
            written = await d.store.run_tool(step)
        except ToolRaised as raised:
            # The transaction rolled back, undoing the tool's own writes.
            if handles and transient(handles[-1], raised.original):
                raise StoreError(
                    f"turn {d.turn_id}: tool {tool.name!r} hit a passing database "
                    f"failure ({error_text(raised.original)}); the step was not recorded: "
                    "deliver the turn again"
                ) from raised.original
            # The tool's own exception: its error result, or a wait to try again.
            span.ended(outcome_of(raised.original))
            ctx = self._context(_NO_CONTEXT_HANDLE, call, step_id, local=False)
            wait = retry_wait(tool.retry, raised.original, ctx, d.steps)
            if wait is not None:
                raise Park((wait,)) from None
            text = error_text(raised.original)
            await self.commit_result(step_id, call, error_result(text), text)
            return
        except FatalToolError as exc:
            raise fatal(tool, exc) from exc
        d.landed(written.step_id, written.stored, written.messages, written.event)

    async def commit_result(
        self, step_id: str, call: ToolCall, value: Any, error: str | None
    ) -> None:
        """Commit a tool step whose result is already known."""
        d = self._d
        written, writes = self._written(len(d.transcript), d.next_seq, step_id, call, value, error)
        await d.store.commit(writes)
        d.landed(written.step_id, written.stored, written.messages, written.event)

    def _written(
        self,
        position: int,
        seq: int,
        step_id: str,
        call: ToolCall,
        value: Any,
        error: str | None,
    ) -> tuple[_Written, list[Write]]:
        """The rows of one tool step: its memo, its ``action.completed``, and its tool
        message with those of the calls after it that were waiting for it (the
        transcript keeps the order the model asked in)."""
        d = self._d
        message = ToolMessage(
            call_id=call.id,
            name=call.name,
            result=value,
            turn_id=d.turn_id,
            is_error=error is not None,
        )
        # Storable now (the message cleaned the result, the call its id and name, and
        # the error is cleaned here once), so the event and memo check nothing again;
        # observers get their own copy of the result to mutate.
        value, error = message.result, None if error is None else storable(error)
        event = _completed(
            turn_id=d.turn_id,
            session_id=d.session_id,
            call_id=call.id,
            name=call.name,
            result=copy_input(value),
            error=error,
            seq=seq,
        )
        stored = {"result": value, "error": error}  # ToolStepResult's to_dict()
        ready = self._ready_after(call, message)
        if len(ready) == 1:  # (the usual batch: no generator for one message)
            writes: list[Write] = [
                PutStep(step_id, d.turn_id, stored),
                AppendMessage(position, ready[0]),
                LogEvent(event),
            ]
        else:
            writes = [PutStep(step_id, d.turn_id, stored)]
            writes += [AppendMessage(position + offset, m) for offset, m in enumerate(ready)]
            writes.append(LogEvent(event))
        return _Written(step_id, stored, ready, event), writes

    def _ready_after(self, call: ToolCall, message: ToolMessage) -> list[ToolMessage]:
        """The messages that join the transcript once ``call``'s result commits."""
        d = self._d
        last = d.transcript[-1]
        if isinstance(last, AssistantMessage) and len(last.tool_calls) == 1:
            return [message]  # the usual batch: one call, answered by this message
        step = next_step(d.transcript, d.turn_id)
        if not isinstance(step, RunTools):
            return [message]
        held = committed_results(step.assistant_index, step.owed, d.steps, d.turn_id)
        held[call.id] = message
        return in_order(step.owed, held)


class _BatchSteps:
    """The tool steps' side of ``run_batch``, for the calls of one assistant message."""

    def __init__(self, steps: ToolSteps, assistant_index: int) -> None:
        self._steps = steps
        self._index = assistant_index

    def runs_remote(self, call: ToolCall) -> bool:
        return self._steps.remote_tool(call) is not None

    async def remote(self, call: ToolCall) -> Outcome:
        steps = self._steps
        tool = steps.remote_tool(call)
        assert tool is not None  # (only calls runs_remote admitted come here)
        step_id = tool_step_id(self._index, call.id)
        d = steps._d
        # The span covers the tool's run; its result commits from the batch's driver.
        with d.step_span(step_id, call=call) as span:
            return await steps.run_remote(tool, step_id, call, span)

    async def commit_remote(self, call: ToolCall, ran: Ran) -> None:
        step_id = tool_step_id(self._index, call.id)
        await self._steps.commit_result(step_id, call, ran.value, ran.error)

    async def run_here(self, call: ToolCall) -> None:
        await self._steps.step(tool_step_id(self._index, call.id), call)

    async def cancel_reason(self) -> str | None:
        return await self._steps._d.poll_cancel()


class _Written(NamedTuple):
    """What one tool step committed: its memo, the messages that joined the
    transcript with it (its own, maybe with later calls' or none yet), its event."""

    step_id: str
    stored: Any
    messages: list[ToolMessage]
    event: ActionCompletedEvent
