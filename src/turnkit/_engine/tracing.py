"""Step spans told how their step ended, and the short error classes spans carry.

The engine wraps each step in ``Traced(...)``: a step that returns ends ``ok``
(unless it already reported a failure, such as a tool's error result), and one
that raises ends as the exception says: cancelled, or failed with its class.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from types import TracebackType

from .._seams.tracer import NO_SPAN, StepOutcome, StepSpan
from .._values.turns import TurnCancelled, TurnFailure
from .tool_results import error_text

#: The error class of a failure with no exception behind it (the semantic
#: conventions' own word for it).
OTHER_ERROR = "_OTHER"


def error_type(exc: BaseException | None) -> str:
    """An exception's class as a span names it: ``ValueError``, ``turnkit.ModelError``,
    ``anthropic.RateLimitError``. A turn failure names the exception behind it."""
    if isinstance(exc, TurnFailure):
        exc = exc.__cause__
    if exc is None:
        return OTHER_ERROR
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


#: A step that returned (one value, made once: every step of every turn reports it).
OK = StepOutcome(status="ok")


def outcome_of(exc: BaseException) -> StepOutcome:
    """How a step that raised ``exc`` ended."""
    if isinstance(exc, TurnCancelled):
        return StepOutcome(status="cancelled", message=exc.reason)
    return StepOutcome(status="failed", error_type=error_type(exc), message=error_text(exc))


#: An untraced step's span (the default tracer's): records nothing, so the engine
#: builds no trace for it and reports nothing to it.
UNTRACED: AbstractContextManager[StepSpan] = nullcontext(NO_SPAN)
#: The span ``UNTRACED`` enters: a step that finds ``UNTRACED`` may use it without
#: the ``with`` statement's two calls (every step of an untraced turn does).
UNTRACED_SPAN: StepSpan = NO_SPAN


class Traced(AbstractContextManager[StepSpan]):
    """Enter a step span and report how the step ended when it exits."""

    __slots__ = ("_manager", "_span")

    def __init__(self, manager: AbstractContextManager[StepSpan]) -> None:
        self._manager = manager

    def __enter__(self) -> StepSpan:
        self._span = self._manager.__enter__()
        return self._span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._span.ended(OK if exc is None else outcome_of(exc))
        return self._manager.__exit__(exc_type, exc, tb)
