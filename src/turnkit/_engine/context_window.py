"""Applying an agent's history policy to one delivery: find the window the previous
model step was sent, ask the policy for this step's, make any summary it needs as a
checkpointed model call (with a ``chat`` step span of its own), and keep the
decision for the step's commit.

Everything a later delivery needs is read from the store (the ``window:<n>`` record
of the latest model step, and the summary step it points to); the ``WindowCache``
kept with a session's known transcript only saves those reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from .._errors import ContextWindowError
from .._seams.store import NO_MESSAGES, SessionStore
from .._seams.tracer import NO_SPAN, StepSpan
from .._values.messages import (
    AssistantMessage,
    Message,
    ModelReply,
    ToolMessage,
    TriggerMessage,
    UserMessage,
)
from .._values.step_ids import history_step_id, window_step_id
from .._values.turns import TurnFailure
from .._values.usage import Usage
from .._values.windows import SummaryRecord, SummaryRef, WindowRecord
from .._values.writes import PutStep, Write
from .agent import Agent
from .history import OPENINGS, HistoryView, HistoryWindow, Summarizer, estimate_tokens
from .model_call import Sent, stored_form, stream_reply, window_failure
from .tool_results import error_text
from .transcript_view import TranscriptView

#: How the system prompt introduces a summary.
SUMMARY_HEADING = "Summary of the earlier part of this conversation (its messages are not shown):"
#: The longest a tool result is quoted in a summary request.
MAX_QUOTE = 2_000


@dataclass
class WindowCache:
    """The window the session's latest model step was sent, kept between deliveries
    in one process, and the token estimates of the messages near it."""

    generation: int
    index: int
    record: WindowRecord
    summary: str | None
    sizes: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Previous:
    record: WindowRecord
    summary: str | None


class ContextWindows:
    """One delivery's use of the agent's history policy."""

    def __init__(
        self,
        *,
        agent: Agent,
        store: SessionStore,
        turn_id: str,
        generation: int,
        steps: Mapping[str, Any],
        remember: Callable[[str, Any], None],
        cache: WindowCache | None,
        boundary: Callable[[], Awaitable[None]],
        cancelled: Callable[[], str | None],
        traced: Callable[[str, Any], AbstractContextManager[StepSpan]] | None = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.turn_id = turn_id
        self.generation = generation
        #: The delivery's step results, and how one this makes joins them.
        self.steps = steps
        self._remember = remember
        self.cache = cache if cache is not None and cache.generation == generation else None
        self.sizes = self.cache.sizes if self.cache is not None else {}
        self._boundary = boundary
        self._cancelled = cancelled
        #: A step span for a summary call (its step id, its model), told how it ended.
        self._traced = traced or _untraced
        #: The window chosen for the step being prepared, until it commits.
        self.chosen: tuple[int, WindowRecord, str | None] | None = None
        #: What this delivery's summary calls used, not yet taken by the runner
        #: (``None``: nothing, the usual case, so a model step adds no usage).
        self._usage: Usage | None = None

    async def prepare(self, transcript: Sequence[Message], index: int, system: str | None) -> Sent:
        """What model step ``index`` is sent under the policy."""
        policy = self.agent.history
        if policy is None:
            return Sent(messages=TranscriptView(transcript, 0, index), system=system)
        previous = await self._previous(transcript, index)
        turn_start = _turn_start(transcript, index, self.turn_id)
        view = HistoryView(
            TranscriptView(transcript, 0, index),
            turn_start=turn_start,
            previous=HistoryWindow(start=previous.record.start, summarize=bool(previous.summary)),
            summary=previous.summary,
            sizes=self.sizes,
        )
        window = policy.window(view)
        self._check(window, transcript, turn_start)
        ref, text = None, None
        if window.summarize and window.start > 0:
            summarizer = getattr(policy, "summarizer", None) or Summarizer()
            ref, text = await self._summary(transcript, window.start, previous, summarizer)
        self.chosen = (index, WindowRecord(start=window.start, summary=ref), text)
        for dropped in range(previous.record.start, window.start):
            self.sizes.pop(dropped, None)  # never read again: windows only move on
        return Sent(
            messages=TranscriptView(transcript, window.start, index),
            system=with_summary(system, text),
        )

    def take_usage(self) -> Usage | None:
        """What the summary calls made since the last call used (then nothing);
        ``None`` when they used nothing (or none was made)."""
        used, self._usage = self._usage, None
        return used

    def writes(self) -> list[Write]:
        """What stores the chosen window with the model step's commit."""
        if self.chosen is None:
            return []
        index, record, _ = self.chosen
        return [PutStep(window_step_id(index), self.turn_id, record.to_dict())]

    def committed(self) -> WindowCache | None:
        """After the step committed: its window becomes the one to start from."""
        if self.chosen is None:
            return self.cache
        index, record, text = self.chosen
        self._remember(window_step_id(index), record.to_dict())
        self.cache = WindowCache(self.generation, index, record, text, self.sizes)
        self.chosen = None
        return self.cache

    # -- the previous window ---------------------------------------------------------

    async def _previous(self, transcript: Sequence[Message], index: int) -> _Previous:
        """The window the latest model step before ``index`` was sent (the whole
        transcript, if it predates the policy or there is none)."""
        latest = _latest_assistant(transcript, index)
        if latest is None:
            return _Previous(WindowRecord(), None)
        cache = self.cache
        if cache is not None and cache.index == latest:
            return _Previous(cache.record, cache.summary)
        owner = transcript[latest].turn_id
        steps = await self._steps_of(owner)
        raw = steps.get(window_step_id(latest))
        if raw is None:
            return _Previous(WindowRecord(), None)
        record = WindowRecord.from_dict(raw)
        summary = None
        if record.summary is not None:
            held = await self._steps_of(record.summary.turn_id)
            stored = held.get(record.summary.step_id)
            if stored is None:
                raise TurnFailure(
                    f"history: the summary {record.summary.step_id} that model step "
                    f"{latest} was sent is missing from the store"
                )
            summary = SummaryRecord.from_dict(stored).text
        return _Previous(record, summary)

    async def _steps_of(self, turn_id: str) -> Mapping[str, Any]:
        if turn_id == self.turn_id:
            return self.steps
        return dict((await self.store.load(turn_id, from_index=NO_MESSAGES)).steps.items())

    def _check(self, window: object, transcript: Sequence[Message], turn_start: int) -> None:
        policy = self.agent.history
        if not isinstance(window, HistoryWindow):
            raise TurnFailure(f"history policy {policy!r} returned {window!r}, not a HistoryWindow")
        start = window.start
        if (
            isinstance(start, bool)
            or not isinstance(start, int)
            or not 0 <= start <= turn_start
            or (start > 0 and not isinstance(transcript[start], OPENINGS))
        ):
            raise TurnFailure(
                f"history policy {policy!r} chose start {start!r}, which is not where a "
                f"turn opens at or before the running turn's opening ({turn_start})"
            )

    # -- summaries ----------------------------------------------------------------------

    async def _summary(
        self, transcript: Sequence[Message], start: int, previous: _Previous, summarizer: Summarizer
    ) -> tuple[SummaryRef, str]:
        """A summary of ``transcript[:start]``: the previous one if it covers exactly
        that, else the previous one with the messages since folded in, a chunk per
        stored model call."""
        covered = previous.record.start if previous.summary is not None else 0
        text = previous.summary
        ref = previous.record.summary
        if covered == start and ref is not None and text is not None:
            return ref, text
        if covered > start:
            raise TurnFailure(
                f"history policy {self.agent.history!r} asked for a summary up to {start}, "
                f"before the end of the stored summary ({covered}); a summarized window "
                "cannot move back"
            )
        while True:
            upto = _chunk_end(transcript, covered, start, summarizer.chunk_tokens, self.sizes)
            ref, text = await self._fold(transcript, covered, upto, text, summarizer)
            if upto >= start:
                return ref, text
            covered = upto

    async def _fold(
        self,
        transcript: Sequence[Message],
        start: int,
        upto: int,
        summary: str | None,
        summarizer: Summarizer,
    ) -> tuple[SummaryRef, str]:
        """Fold ``transcript[start:upto]`` into ``summary``: the stored step if an
        earlier delivery of this turn made it, else one model call, committed."""
        step_id = history_step_id(self.turn_id, upto)
        ref = SummaryRef(step_id=step_id, turn_id=self.turn_id)
        stored = self.steps.get(step_id)
        if stored is not None:
            return ref, SummaryRecord.from_dict(stored).text
        await self._boundary()
        prompt = summary_request(summary, transcript[start:upto])
        model = summarizer.model or self.agent.model
        # A stored summary (above) is read back, not called: like a committed model
        # step it gets no span in a later delivery.
        with self._traced(step_id, model) as span:
            reply = await _call(
                model, prompt, summarizer.instructions, self.turn_id, self._cancelled
            )
            span.replied(reply)
            record = SummaryRecord(text=reply.text, upto=upto, usage=reply.usage)
            await self.store.commit([PutStep(step_id, self.turn_id, record.to_dict())])
        self._remember(step_id, record.to_dict())
        if reply.usage is not None:
            self._usage = reply.usage if self._usage is None else self._usage + reply.usage
        return ref, record.text


def _untraced(step_id: str, model: Any) -> AbstractContextManager[StepSpan]:
    return nullcontext(NO_SPAN)


async def _call(
    model: Any, prompt: str, instructions: str, turn_id: str, cancelled: Callable[[], str | None]
) -> ModelReply:
    """One summary call: the reply, checked as a model step's is."""
    messages = [UserMessage(text=prompt, turn_id=turn_id)]
    reply = await stream_reply(
        lambda: model.stream(messages, (), system=instructions), cancelled, _summary_failure
    )
    if reply is None or not reply.text:
        raise TurnFailure("model error: a history summary call gave no text")
    return stored_form(reply)[0]


def _summary_failure(exc: Exception) -> TurnFailure:
    """A summary call's wording for a failed call."""
    if isinstance(exc, ContextWindowError):
        return window_failure(f"a history summary call: {exc}")
    return TurnFailure(f"model error: a history summary call failed: {error_text(exc)}")


def with_summary(system: str | None, summary: str | None) -> str | None:
    """The system prompt with the summary of what the window leaves out after it."""
    if not summary:
        return system
    block = f"{SUMMARY_HEADING}\n{summary}"
    return f"{system}\n\n{block}" if system else block


def summary_request(summary: str | None, messages: Sequence[Message]) -> str:
    """The text a summary call is sent: the summary so far, then the new messages."""
    parts = [f"Summary so far:\n{summary}" if summary else "Summary so far: (none)"]
    parts.append("New messages:")
    parts.extend(_line(m) for m in messages)
    return "\n\n".join(parts)


def _line(message: Message) -> str:
    if isinstance(message, ToolMessage):
        shown = message.result if isinstance(message.result, str) else repr(message.result)
        cut = shown if len(shown) <= MAX_QUOTE else shown[:MAX_QUOTE] + "…"
        return f"[{message.name} result{' (error)' if message.is_error else ''}] {cut}"
    if isinstance(message, AssistantMessage):
        calls = "".join(f"\n  -> called {c.name}({c.input})" for c in message.tool_calls)
        return f"Assistant: {message.text}{calls}"
    if isinstance(message, TriggerMessage):
        return f"Trigger ({message.by}): {message.text}"
    return f"User: {message.text}"


def _latest_assistant(transcript: Sequence[Message], index: int) -> int | None:
    """The position of the latest assistant message before ``index``."""
    for i in range(index - 1, -1, -1):
        if isinstance(transcript[i], AssistantMessage):
            return i
    return None


def _turn_start(transcript: Sequence[Message], index: int, turn_id: str) -> int:
    """The position of the running turn's opening (its messages end the transcript)."""
    for i in range(index - 1, -1, -1):
        message = transcript[i]
        if message.turn_id == turn_id and isinstance(message, OPENINGS):
            return i
    raise TurnFailure(f"history: turn {turn_id} has no opening message before position {index}")


def _chunk_end(
    transcript: Sequence[Message], start: int, end: int, budget: int, sizes: dict[int, int]
) -> int:
    """Where a summary chunk from ``start`` ends: the furthest turn opening up to
    ``end`` keeping the chunk within ``budget`` tokens (at least one turn)."""
    used, best = 0, None
    for i in range(start, end):
        if i > start and isinstance(transcript[i], OPENINGS):
            if used > budget:  # tokens of transcript[start:i]
                return best if best is not None else i
            best = i
        size = sizes.get(i)
        used += size if size is not None else estimate_tokens(transcript[i])
    return end if used <= budget or best is None else best
