"""The turn loop: ask the model, run the tools it asked for, repeat, checkpointing each step.

The engine reads its position off the transcript (see ``_position``), talks only to
its three seams (``SessionStore``, ``EventSink``, ``Model``) and commits every step
together with the events it caused, so a replay resumes at the first unfinished step.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal, overload

from ._agent import Agent
from ._context import NoHandle, ToolContext
from ._errors import FatalToolError, ModelError, StoreError
from ._events import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    EventSink,
    MessageCompletedEvent,
    MessageDeltaEvent,
    ReasoningDeltaEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnStartedEvent,
)
from ._inbound import InboundEvent
from ._messages import (
    AssistantMessage,
    Message,
    ModelReply,
    OpeningMessage,
    ToolCall,
    ToolMessage,
)
from ._model import ModelDone, ReasoningDelta, TextDelta
from ._position import (
    CallModel,
    Finished,
    RunTools,
    has_opening_message,
    model_step_id,
    next_step,
    stale_calls,
    tool_step_id,
)
from ._store import SessionStore, Transaction, TurnRecord
from ._tool_results import error_result, error_text, to_json_result
from ._tools import Tool

log = logging.getLogger("turnkit.engine")

_REMOTE_HANDLE = NoHandle(
    "this tool is async (remote) and runs outside the step transaction; "
    "declare it with plain `def` to write through the store"
)
STALE_CALL_ERROR = "not run: the turn that asked for this call ended before it ran"


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """One delivery of a turn: its id, its opening message and where it came from."""

    turn_id: str
    opening: OpeningMessage
    event: InboundEvent | None = None


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """How a turn ended: ``completed`` with ``text``, or ``failed`` with ``error``."""

    turn_id: str
    status: Literal["completed", "failed"]
    text: str | None = None
    error: str | None = None


class _TurnFailure(Exception):
    """Internal: ends the turn as failed with this message."""


class _ToolRaised(Exception):
    """Internal: a local tool raised; its transaction must roll back before we record it."""

    def __init__(self, original: BaseException) -> None:
        self.original = original


class _TranscriptView(Sequence[Message]):
    """A read-only, fixed-length window on the growing transcript: O(1) to make."""

    __slots__ = ("_items", "_len")

    def __init__(self, items: list[Message]) -> None:
        self._items = items
        self._len = len(items)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Message]:
        return islice(self._items, self._len)

    @overload
    def __getitem__(self, i: int) -> Message: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Message]: ...
    def __getitem__(self, i: int | slice) -> Message | Sequence[Message]:
        if isinstance(i, slice):
            return self._items[: self._len][i]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("transcript index out of range")
        return self._items[i]


def result_from_record(record: TurnRecord) -> TurnResult:
    if record.status == "completed":
        return TurnResult(turn_id=record.turn_id, status="completed", text=record.text or "")
    return TurnResult(turn_id=record.turn_id, status="failed", error=record.error or "failed")


class TurnRunner:
    """Drives one delivery of one turn to its end. Create one per delivery."""

    def __init__(
        self,
        *,
        agent: Agent,
        store: SessionStore,
        sink: EventSink,
        request: TurnRequest,
        runtime: Any = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.sink = sink
        self.request = request
        self.runtime = runtime
        self.turn_id = request.turn_id
        self.session_id = store.session_id
        self.transcript: list[Message] = []
        self.steps: dict[str, Any] = {}
        self.next_seq = 1
        self.opened = False
        self.event = request.event

    async def run(self) -> TurnResult:
        snap = await self.store.load(self.turn_id)
        if snap.agent is not None and snap.agent != self.agent.name:
            raise StoreError(
                f"session {self.session_id} belongs to agent {snap.agent!r}, "
                f"not {self.agent.name!r}"
            )
        self.transcript, self.steps, self.next_seq = snap.messages, snap.steps, snap.next_seq
        record = snap.turn
        if record is not None and self.event is None and record.event is not None:
            self.event = InboundEvent.from_dict(record.event)
        if record is not None and record.status == "completed":
            return result_from_record(record)
        try:
            if record is None:
                await self._open()
            elif not has_opening_message(self.transcript, self.turn_id):
                # A later turn has started since; this one can no longer continue.
                return result_from_record(record)
            elif record.status == "failed":
                await self._reopen()
            self.opened = True
            return await self._loop()
        except _TurnFailure as failure:
            return await self._fail(str(failure))

    async def _loop(self) -> TurnResult:
        while True:
            step = next_step(self.transcript, self.turn_id)
            if isinstance(step, CallModel):
                await self._model_step(step.index)
            elif isinstance(step, RunTools):
                for call in step.owed:
                    await self._tool_step(step.assistant_index, call)
            elif isinstance(step, Finished):
                return TurnResult(turn_id=self.turn_id, status="completed", text=step.text)
            else:
                raise StoreError(f"turn {self.turn_id}: opening message missing after commit")

    # -- commits -----------------------------------------------------------------

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

    async def _open(self) -> None:
        opening = self.request.opening
        index = len(self.transcript)
        closing = self._stale_call_messages()
        record = TurnRecord(
            session_id=self.session_id,
            turn_id=self.turn_id,
            agent=self.agent.name,
            status="running",
            opening=opening.to_dict(),
            event=self.event.to_dict() if self.event else None,
            created_at=time.time(),
        )
        # The turn before ours, if a crash left it open, ends here: ours supersedes it.
        previous = self.transcript[-1].turn_id if self.transcript else None
        stale_record = await self.store.turn(previous) if previous else None

        def write(tx: Transaction) -> None:
            if stale_record is not None and stale_record.status == "running":
                tx.set_turn_status(
                    stale_record.turn_id,
                    "failed",
                    error="interrupted: a later turn started before it was recovered",
                )
            for offset, (step_id, msg) in enumerate(closing):
                tx.put_step(step_id, msg.turn_id, {"result": msg.result, "error": STALE_CALL_ERROR})
                tx.append_message(index + offset, msg)
            tx.append_message(index + len(closing), opening)
            tx.open_turn(record)

        started = TurnStartedEvent(
            turn_id=self.turn_id, session_id=self.session_id, text=opening.text, seq=self.next_seq
        )
        await self._commit(write, [started], [m for _, m in closing] + [opening])

    def _stale_call_messages(self) -> list[tuple[str, ToolMessage]]:
        stale = stale_calls(self.transcript, self.turn_id)
        if stale is None:
            return []
        index, calls = stale
        owner = self.transcript[index].turn_id
        return [
            (
                tool_step_id(index, c.id),
                ToolMessage(
                    call_id=c.id,
                    name=c.name,
                    result=error_result(STALE_CALL_ERROR),
                    turn_id=owner,
                    is_error=True,
                ),
            )
            for c in calls
        ]

    async def _reopen(self) -> None:
        def write(tx: Transaction) -> None:
            tx.set_turn_status(self.turn_id, "running")

        text = self.request.opening.text
        started = TurnStartedEvent(
            turn_id=self.turn_id, session_id=self.session_id, text=text, seq=self.next_seq
        )
        await self._commit(write, [started])

    async def _fail(self, error: str) -> TurnResult:
        if self.opened:

            def write(tx: Transaction) -> None:
                tx.set_turn_status(self.turn_id, "failed", error=error)

            failed = TurnFailedEvent(
                turn_id=self.turn_id, session_id=self.session_id, error=error, seq=self.next_seq
            )
            await self._commit(write, [failed])
        return TurnResult(turn_id=self.turn_id, status="failed", error=error)

    # -- model steps -------------------------------------------------------------

    async def _model_step(self, index: int) -> None:
        step_id = model_step_id(index)
        cached = self.steps.get(step_id)
        reply = ModelReply.from_dict(cached) if cached is not None else await self._ask_model()
        message = AssistantMessage(
            text=reply.text, turn_id=self.turn_id, tool_calls=reply.tool_calls, stop=reply.stop
        )
        tid, sid, seq = self.turn_id, self.session_id, self.next_seq
        events: list[TurnEvent] = [
            MessageCompletedEvent(turn_id=tid, session_id=sid, message=message, seq=seq)
        ]
        events += [
            ActionRequestedEvent(turn_id=tid, session_id=sid, call=c, seq=seq + i)
            for i, c in enumerate(reply.tool_calls, start=1)
        ]
        final = not reply.tool_calls
        if final:
            events.append(
                TurnCompletedEvent(turn_id=tid, session_id=sid, text=reply.text, seq=seq + 1)
            )

        def write(tx: Transaction) -> None:
            if cached is None:
                tx.put_step(step_id, self.turn_id, reply.to_dict())
            tx.append_message(index, message)
            if final:
                tx.set_turn_status(self.turn_id, "completed", text=reply.text)

        await self._commit(write, events, [message])

    async def _ask_model(self) -> ModelReply:
        system = self.agent.instructions or None
        view = _TranscriptView(self.transcript)
        reply: ModelReply | None = None
        try:
            stream = self.agent.model.stream(view, self.agent.tool_specs, system=system)
            try:
                async for delta in stream:
                    if isinstance(delta, TextDelta):
                        self._emit(self._delta(MessageDeltaEvent, delta.text))
                    elif isinstance(delta, ReasoningDelta):
                        self._emit(self._delta(ReasoningDeltaEvent, delta.text))
                    elif isinstance(delta, ModelDone):
                        reply = delta.reply
                        break
                    else:
                        raise ModelError(f"model yielded {delta!r}, not a ModelDelta")
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
        except Exception as exc:
            raise _TurnFailure(f"model error: {error_text(exc)}") from exc
        if reply is None:
            raise _TurnFailure("model error: the stream ended without ModelDone")
        _check_reply(reply)
        return reply

    def _delta(
        self, kind: type[MessageDeltaEvent] | type[ReasoningDeltaEvent], text: str
    ) -> TurnEvent:
        return kind(turn_id=self.turn_id, session_id=self.session_id, text=text)

    # -- tool steps --------------------------------------------------------------

    def _context(self, handle: Any, call: ToolCall, step_id: str) -> ToolContext:
        return ToolContext(
            store=handle,
            agent=self.agent,
            session_id=self.session_id,
            turn_id=self.turn_id,
            call_id=call.id,
            event=self.event,
            runtime=self.runtime,
            step_id=step_id,
        )

    async def _tool_step(self, assistant_index: int, call: ToolCall) -> None:
        step_id = tool_step_id(assistant_index, call.id)
        if step_id in self.steps:
            # Memoized but its message is missing: record it, never run the tool again.
            cached = self.steps[step_id]
            await self._record_tool(step_id, call, cached["result"], cached["error"], memoized=True)
            return
        tool = self.agent.tool(call.name)
        if tool is None:
            text = f"unknown tool: {call.name}"
            await self._record_tool(step_id, call, error_result(text), text)
        elif tool.local:
            await self._local_tool_step(tool, step_id, call)
        else:
            await self._remote_tool_step(tool, step_id, call)

    async def _local_tool_step(self, tool: Tool, step_id: str, call: ToolCall) -> None:
        """Run a ``def`` tool inside the commit that records its result."""

        def run_inside(tx: Transaction) -> Any:
            ctx = self._context(tx.handle, call, step_id)
            try:
                value = tool.run(call.input, ctx)
            except FatalToolError:
                raise
            except Exception as exc:
                raise _ToolRaised(exc) from exc
            if inspect.isawaitable(value):
                _discard(value)
                raise _TurnFailure(
                    f"tool {tool.name!r} is declared with plain `def` but returned an awaitable; "
                    "declare it `async def` so the engine awaits it outside the transaction"
                )
            try:
                return to_json_result(value)
            except Exception as exc:
                raise _ToolRaised(exc) from exc

        try:
            await self._record_tool(step_id, call, run_inside, None)
        except _ToolRaised as raised:
            # The transaction rolled back, undoing the tool's own writes; record the error.
            text = error_text(raised.original)
            await self._record_tool(step_id, call, error_result(text), text)
        except FatalToolError as exc:
            raise _TurnFailure(f"tool {tool.name!r} failed the turn: {error_text(exc)}") from exc

    async def _remote_tool_step(self, tool: Tool, step_id: str, call: ToolCall) -> None:
        """Await an ``async def`` tool outside any transaction, then commit its result."""
        ctx = self._context(_REMOTE_HANDLE, call, step_id)
        try:
            result, error = to_json_result(await tool.run(call.input, ctx)), None
        except FatalToolError as exc:
            raise _TurnFailure(f"tool {tool.name!r} failed the turn: {error_text(exc)}") from exc
        except Exception as exc:
            error = error_text(exc)
            result = error_result(error)
        await self._record_tool(step_id, call, result, error)

    async def _record_tool(
        self,
        step_id: str,
        call: ToolCall,
        result: Any | Callable[[Transaction], Any],
        error: str | None,
        *,
        memoized: bool = False,
    ) -> None:
        """Commit a tool step: its result, the tool message and ``action.completed``.

        ``result`` may be a function of the transaction, which is how a local tool
        runs inside the very commit that records what it returned.
        """
        index, seq = len(self.transcript), self.next_seq

        def work(tx: Transaction) -> tuple[ToolMessage, ActionCompletedEvent]:
            value = result(tx) if callable(result) else result
            message = ToolMessage(
                call_id=call.id,
                name=call.name,
                result=value,
                turn_id=self.turn_id,
                is_error=error is not None,
            )
            event = ActionCompletedEvent(
                turn_id=self.turn_id,
                session_id=self.session_id,
                call_id=call.id,
                name=call.name,
                result=value,
                error=error,
                seq=seq,
            )
            if not memoized:
                tx.put_step(step_id, self.turn_id, {"result": value, "error": error})
            tx.append_message(index, message)
            tx.log_event(event)
            return message, event

        message, event = await self.store.commit(work)
        self.next_seq += 1
        self.transcript.append(message)
        self._emit(event)


def _check_reply(reply: ModelReply) -> None:
    if reply.empty and reply.stop is not None and reply.stop.abnormal:
        raw = f" ({reply.stop.raw})" if reply.stop.raw else ""
        raise _TurnFailure(
            f"model error: the model stopped with {reply.stop.kind}{raw} and an empty reply"
        )
    seen: set[str] = set()
    for call in reply.tool_calls:
        if not call.id or call.id in seen:
            raise _TurnFailure(f"model error: tool call id {call.id!r} is empty or repeated")
        seen.add(call.id)


def _discard(value: Any) -> None:
    close = getattr(value, "close", None)
    if close is not None:
        close()
