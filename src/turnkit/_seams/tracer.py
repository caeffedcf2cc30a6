"""The ``Tracer`` seam: how the engine reports its work to a tracing system.

One delivery of a turn is one turn span, and each model or tool step it runs is a
step span inside it; the engine tells every span how it ended and never learns
what records them. ``NO_TRACER`` (the default) records nothing; ``turnkit.otel``
implements the seam with OpenTelemetry. See ``docs/tracing.md``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from .._values.messages import ModelReply, ToolCall
from .._values.turns import TurnResult

#: A span's position in a trace as W3C Trace Context headers (``traceparent`` and,
#: if any, ``tracestate``): what is stored with a turn and carried between processes.
TraceContext: TypeAlias = dict[str, str]

#: How a step ended: ``ok``; ``failed`` (an error: the model's, or a tool's, which
#: the model is shown); ``parked`` (the turn waits for an answer inside it);
#: ``cancelled``.
StepStatus: TypeAlias = Literal["ok", "failed", "parked", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class TurnTrace:
    """What a tracer is told about the delivery it opens a turn span for."""

    session_id: str
    turn_id: str
    agent: str
    #: The turn was delivered before: this delivery resumes a parked turn, recovers
    #: one a dead process left running, or retries a failed one.
    replayed: bool
    #: The context stored with the turn when it first opened (``None``: none was).
    origin: TraceContext | None = None
    #: The context of the code that asked for this delivery (``start``, ``resume``,
    #: ``recover``), captured by ``Tracer.current`` when it asked.
    parent: TraceContext | None = None
    #: The agent version this delivery runs (``Agent.turn_version``).
    version: str | None = None


@dataclass(frozen=True, kw_only=True)
class StepTrace:
    """One step a delivery runs. ``replayed`` marks the first step of a redelivery:
    the step its earlier delivery was at when it stopped, which may already have
    begun there (a parked tool call always had)."""

    step_id: str
    replayed: bool = False
    #: The tool step's call (``None`` for a model step).
    call: ToolCall | None = None
    #: The model step's model object (``None`` for a tool step).
    model: Any = None


@dataclass(frozen=True, kw_only=True)
class StepOutcome:
    """How a step ended. A failure names its ``error_type``, a short class of error
    (an exception's qualified name, or ``_OTHER``), and a ``message``."""

    status: StepStatus
    error_type: str | None = None
    message: str | None = None


@runtime_checkable
class StepSpan(Protocol):
    """A model or tool step's span; it ends when its context manager exits."""

    def replied(self, reply: ModelReply) -> None:
        """A model step's reply, before it is committed (its model, usage, stop)."""
        ...

    def ended(self, outcome: StepOutcome) -> None:
        """How the step ended; the first outcome reported counts."""
        ...


@runtime_checkable
class TurnSpan(Protocol):
    """One delivery's span; it ends when its context manager exits."""

    def context(self) -> TraceContext:
        """This span's context, stored with the turn when the delivery opens it, so
        later deliveries can refer to it (empty when nothing is recorded)."""
        ...

    def step(self, step: StepTrace) -> AbstractContextManager[StepSpan]:
        """A span for ``step``, inside this one."""
        ...

    def ended(self, result: TurnResult, error_type: str | None = None) -> None:
        """How the delivery ended (a failed turn names its ``error_type``)."""
        ...

    def broke(self, error_type: str, message: str) -> None:
        """The delivery stopped on an exception, leaving the turn open for another."""
        ...


@runtime_checkable
class Tracer(Protocol):
    """What the runtime and the engine ask of a tracing system."""

    def current(self) -> TraceContext | None:
        """The context of the running code, to carry into a delivery it asks for
        (``None`` when there is none)."""
        ...

    def turn(self, turn: TurnTrace) -> AbstractContextManager[TurnSpan]:
        """A span for one delivery of ``turn``."""
        ...


class _NoSpan:
    """Records nothing."""

    def replied(self, reply: ModelReply) -> None:
        pass

    def ended(self, *args: Any, **kwargs: Any) -> None:
        pass

    def broke(self, error_type: str, message: str) -> None:
        pass

    def context(self) -> TraceContext:
        return {}

    def step(self, step: StepTrace) -> AbstractContextManager[StepSpan]:
        return _NO_SPAN_CONTEXT


NO_SPAN = _NoSpan()
_NO_SPAN_CONTEXT: AbstractContextManager[Any] = nullcontext(NO_SPAN)


class NoTracer:
    """The default tracer: every span it gives records nothing."""

    def current(self) -> TraceContext | None:
        return None

    def turn(self, turn: TurnTrace) -> AbstractContextManager[TurnSpan]:
        return _NO_SPAN_CONTEXT


NO_TRACER = NoTracer()
