"""History policies: which part of a long transcript each model step is sent.

A policy is a pure function of a ``HistoryView`` (the transcript, where the running
turn opened, what the previous model step was sent) returning a ``HistoryWindow``:
the transcript position to send from, and whether a summary of everything before it
goes into the system prompt. The engine stores each decision and every summary as
steps, so a replay sends exactly what the first delivery sent. A window always
starts where a turn opens, so a tool call is never sent without its result, nor a
thinking block without the tool loop it belongs to.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._errors import ConfigurationError
from .._values.messages import AssistantMessage, Message, ToolMessage, TriggerMessage, UserMessage

if TYPE_CHECKING:
    from .._seams.model import Model

#: The messages that open a turn: the only places a window may start.
OPENINGS = (UserMessage, TriggerMessage)


def estimate_tokens(message: Message) -> int:
    """A rough token count of ``message``: about four characters a token, counting
    its text, tool inputs and results, plus a few tokens of framing."""
    size = len(message.text) if not isinstance(message, ToolMessage) else 0
    if isinstance(message, AssistantMessage):
        size += sum(len(c.name) + len(json.dumps(c.input)) for c in message.tool_calls)
    elif isinstance(message, ToolMessage):
        result = message.result
        size += len(result) if isinstance(result, str) else len(json.dumps(result, default=str))
    return size // 4 + 4


@dataclass(frozen=True, kw_only=True)
class HistoryWindow:
    """What a model step is sent: the transcript from ``start`` (where a turn opens),
    and, when ``summarize``, a summary of everything before ``start`` in the system
    prompt (made once, by a checkpointed model call, then reused)."""

    start: int = 0
    summarize: bool = False


class HistoryView:
    """What a policy decides from: the transcript up to this step (``messages``), the
    position of the running turn's opening (``turn_start``), the window the previous
    model step was sent (``previous``, with its summary's text ``summary``), and
    token estimates that cost only what the policy reads."""

    __slots__ = ("_count", "_sizes", "messages", "previous", "summary", "turn_start")

    def __init__(
        self,
        messages: Sequence[Message],
        *,
        turn_start: int,
        previous: HistoryWindow,
        summary: str | None,
        sizes: dict[int, int],
        count: Callable[[Message], int] = estimate_tokens,
    ) -> None:
        self.messages = messages
        self.turn_start = turn_start
        self.previous = previous
        self.summary = summary
        self._sizes = sizes
        self._count = count

    def size(self, index: int) -> int:
        """The estimated tokens of message ``index`` (counted once per session)."""
        found = self._sizes.get(index)
        if found is None:
            found = self._sizes[index] = self._count(self.messages[index])
        return found

    def tokens(self, start: int, end: int | None = None) -> int:
        """The estimated tokens of ``messages[start:end]``."""
        stop = len(self.messages) if end is None else end
        return sum(self.size(i) for i in range(start, stop))

    @property
    def summary_tokens(self) -> int:
        """The estimated tokens of the previous step's summary (0 without one)."""
        return len(self.summary) // 4 + 4 if self.summary else 0

    def turn_starts(self, before: int) -> Iterator[int]:
        """Positions where a turn opens, at ``before`` and earlier, newest first."""
        for i in range(min(before, len(self.messages) - 1), -1, -1):
            if isinstance(self.messages[i], OPENINGS):
                yield i

    def fit(self, budget: int, *, floor: int = 0) -> int:
        """The earliest turn opening at or after ``floor`` from which the rest of the
        transcript stays within ``budget`` tokens; the running turn's opening if even
        that does not fit (a turn is never cut)."""
        best = self.turn_start
        used = self.tokens(self.turn_start)
        for i in range(self.turn_start - 1, floor - 1, -1):
            used += self.size(i)
            if used > budget:
                break
            if isinstance(self.messages[i], OPENINGS):
                best = i
        return best


@runtime_checkable
class HistoryPolicy(Protocol):
    """Decides what each model step is sent. ``window`` must be a pure function of the
    view (a replay asks again and must get the same answer) and return a start where
    a turn opens, at or before the running turn's opening."""

    def window(self, view: HistoryView) -> HistoryWindow: ...


def _positive(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{owner}: {name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class LastTurns:
    """Send the last ``turns`` turns (the running one included); drop older ones."""

    turns: int

    def __post_init__(self) -> None:
        _positive("LastTurns", "turns", self.turns)

    def window(self, view: HistoryView) -> HistoryWindow:
        start, kept = view.turn_start, 1
        for opening in view.turn_starts(view.turn_start - 1):
            if kept >= self.turns:
                break
            start, kept = opening, kept + 1
        return HistoryWindow(start=start)


@dataclass(frozen=True)
class TokenBudget:
    """Send what fits in ``max_tokens`` (estimated), dropping the oldest turns.

    When the window outgrows the budget it is cut back to ``trim_to`` tokens (half
    the budget by default), then left alone while it grows again: its start moves
    now and then, not on every turn, which keeps a provider's prompt cache warm.
    """

    max_tokens: int
    trim_to: int | None = None

    def __post_init__(self) -> None:
        _positive("TokenBudget", "max_tokens", self.max_tokens)
        if self.trim_to is not None:
            _positive("TokenBudget", "trim_to", self.trim_to)

    def window(self, view: HistoryView) -> HistoryWindow:
        start = view.previous.start
        if view.tokens(start) <= self.max_tokens:
            return HistoryWindow(start=start)
        return HistoryWindow(start=view.fit(self.trim_to or self.max_tokens // 2, floor=start))


#: What a summary call is told to do.
SUMMARY_INSTRUCTIONS = (
    "You maintain the running summary of a long conversation between a user and an "
    "assistant that uses tools. Merge the existing summary (if any) with the new "
    "messages into one summary. Keep every fact, decision, name, number, open question "
    "and promise the assistant may need later; drop pleasantries. Write plain prose or "
    "terse bullet points, under 400 words, and nothing else."
)


@dataclass(frozen=True, kw_only=True)
class Summarizer:
    """How summaries are made: by ``model`` (the agent's own when ``None``), told
    ``instructions``, sent at most about ``chunk_tokens`` of transcript per call (a
    longer stretch is folded in over several calls, each a step of its own)."""

    model: Model | None = None
    instructions: str = SUMMARY_INSTRUCTIONS
    chunk_tokens: int = 50_000

    def __post_init__(self) -> None:
        _positive("Summarizer", "chunk_tokens", self.chunk_tokens)
        if self.model is not None and not hasattr(self.model, "stream"):
            raise ConfigurationError(f"Summarizer: model {self.model!r} has no stream() method")


@dataclass(frozen=True)
class SummarizeOlder:
    """Keep the conversation within ``max_tokens`` (estimated, summary included) by
    summarizing the oldest turns instead of dropping them.

    When it outgrows the budget, the turns before the last ``keep_tokens`` (half the
    budget by default) are folded into the summary, which the system prompt carries
    from then on. Each summary is a model call stored as its own step, made once and
    reused by every later step, replay and process.
    """

    max_tokens: int
    keep_tokens: int | None = None
    summarizer: Summarizer = field(default_factory=Summarizer)

    def __post_init__(self) -> None:
        _positive("SummarizeOlder", "max_tokens", self.max_tokens)
        if self.keep_tokens is not None:
            _positive("SummarizeOlder", "keep_tokens", self.keep_tokens)

    def window(self, view: HistoryView) -> HistoryWindow:
        start = view.previous.start
        if view.summary_tokens + view.tokens(start) <= self.max_tokens:
            return HistoryWindow(start=start, summarize=True)
        keep = self.keep_tokens or self.max_tokens // 2
        return HistoryWindow(start=view.fit(keep, floor=start), summarize=True)
