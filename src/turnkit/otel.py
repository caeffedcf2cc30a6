"""OpenTelemetry spans for turns, model steps and tool calls (the ``turnkit[otel]`` extra).

``Runtime(..., tracer=OtelTracer())`` turns every delivery of a turn into an
``invoke_agent`` span, each model step into a ``chat`` span and each tool call into
an ``execute_tool`` span, with the GenAI semantic conventions' attributes and
turnkit's own. Only ``opentelemetry-api`` is needed: until an SDK's tracer provider
is configured, the spans record nothing. See ``docs/tracing.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "turnkit.otel needs OpenTelemetry's API: pip install 'turnkit[otel]'"
    ) from exc

from ._seams.tracer import StepOutcome, StepTrace, TraceContext, TurnTrace
from ._values.messages import ModelReply
from ._values.turns import TurnResult
from ._values.usage import Usage

__all__ = ["OtelTracer"]

#: Stored contexts are always W3C Trace Context, whatever propagators the
#: application configured: what one process stores, another must read.
_W3C = TraceContextTextMapPropagator()

# The GenAI semantic conventions' names (development status, as of semconv 1.37+).
OPERATION = "gen_ai.operation.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
# turnkit's own.
SESSION_ID = "turnkit.session.id"
TURN_ID = "turnkit.turn.id"
STEP_ID = "turnkit.step.id"
REPLAYED = "turnkit.replayed"
AGENT_VERSION = "turnkit.agent.version"
TURN_STATUS = "turnkit.turn.status"
STEP_OUTCOME = "turnkit.step.outcome"


class OtelTracer:
    """turnkit's ``Tracer`` seam on OpenTelemetry.

    ``tracer_provider`` defaults to the global one (``trace.set_tracer_provider``),
    looked up when each span starts, so the tracer may be made before the SDK is
    configured.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("turnkit", tracer_provider=tracer_provider)

    def current(self) -> TraceContext | None:
        carrier: TraceContext = {}
        _W3C.inject(carrier)
        return carrier or None

    def turn(self, turn: TurnTrace) -> AbstractContextManager[_TurnSpan]:
        return self._turn(turn)

    @contextmanager
    def _turn(self, turn: TurnTrace) -> Iterator[_TurnSpan]:
        # With no caller's context the delivery starts a trace of its own: the task
        # it runs in may have been started by some other request.
        parent = _W3C.extract(turn.parent) if turn.parent else otel_context.Context()
        links = []
        origin = _span_context(turn.origin)
        if origin is not None:
            links.append(trace.Link(origin, {"turnkit.link": "turn.origin"}))
        common = {
            CONVERSATION_ID: turn.session_id,
            AGENT_NAME: turn.agent,
            SESSION_ID: turn.session_id,
            TURN_ID: turn.turn_id,
        }
        span = self._tracer.start_span(
            f"invoke_agent {turn.agent}",
            context=parent,
            kind=trace.SpanKind.INTERNAL,
            attributes={
                **common,
                OPERATION: "invoke_agent",
                REPLAYED: turn.replayed,
                **({AGENT_VERSION: turn.version} if turn.version is not None else {}),
            },
            links=links,
        )
        with _current(span):
            yield _TurnSpan(self._tracer, span, common)


class _TurnSpan:
    """One delivery's ``invoke_agent`` span."""

    def __init__(self, tracer: trace.Tracer, span: trace.Span, common: dict[str, Any]) -> None:
        self._tracer = tracer
        self._span = span
        self._common = common
        #: What this delivery's model steps reported, summed.
        self._usage: Usage | None = None

    def context(self) -> TraceContext:
        carrier: TraceContext = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def step(self, step: StepTrace) -> AbstractContextManager[_StepSpan]:
        return self._step(step)

    @contextmanager
    def _step(self, step: StepTrace) -> Iterator[_StepSpan]:
        attributes = {**self._common, STEP_ID: step.step_id, REPLAYED: step.replayed}
        if step.call is not None:
            name = f"execute_tool {step.call.name}"
            kind = trace.SpanKind.INTERNAL
            attributes |= {
                OPERATION: "execute_tool",
                TOOL_NAME: step.call.name,
                TOOL_CALL_ID: step.call.id,
                TOOL_TYPE: "function",
            }
        else:
            model = _model_name(step.model)
            name = f"chat {model}" if model else "chat"
            kind = trace.SpanKind.CLIENT
            attributes[OPERATION] = "chat"
            if model:
                attributes[REQUEST_MODEL] = model
            provider = getattr(step.model, "provider", None)
            if isinstance(provider, str) and provider:
                attributes[PROVIDER] = provider
        span = self._tracer.start_span(
            name,
            context=trace.set_span_in_context(self._span),
            kind=kind,
            attributes=attributes,
        )
        # Current while the step runs, so a model SDK's or a tool's own spans nest here.
        with _current(span):
            yield _StepSpan(span, self)

    def used(self, usage: Usage) -> None:
        self._usage = usage if self._usage is None else self._usage + usage

    def ended(self, result: TurnResult, error_type: str | None = None) -> None:
        self._span.set_attribute(TURN_STATUS, result.status)
        if self._usage is not None:
            _set_usage(self._span, self._usage)
        if result.status == "failed":
            _fail(self._span, error_type or "_OTHER", result.error)

    def broke(self, error_type: str, message: str) -> None:
        _fail(self._span, error_type, message)


class _StepSpan:
    """A model step's ``chat`` span or a tool call's ``execute_tool`` span."""

    def __init__(self, span: trace.Span, turn: _TurnSpan) -> None:
        self._span = span
        self._turn = turn
        self._done = False

    def replied(self, reply: ModelReply) -> None:
        if reply.stop is not None:
            self._span.set_attribute(FINISH_REASONS, [reply.stop.raw or reply.stop.kind])
        if reply.model is not None:
            self._span.set_attribute(RESPONSE_MODEL, reply.model)
        if reply.usage is not None:
            _set_usage(self._span, reply.usage)
            self._turn.used(reply.usage)

    def ended(self, outcome: StepOutcome) -> None:
        if self._done:
            return
        self._done = True
        self._span.set_attribute(STEP_OUTCOME, outcome.status)
        if outcome.status == "failed":
            _fail(self._span, outcome.error_type or "_OTHER", outcome.message)


def _set_usage(span: trace.Span, usage: Usage) -> None:
    """The token counts, as the conventions count them: input includes the cached
    tokens, output the reasoning ones (which turnkit's ``Usage`` does too)."""
    span.set_attributes(
        {
            INPUT_TOKENS: usage.input_tokens,
            OUTPUT_TOKENS: usage.output_tokens,
            CACHE_READ_TOKENS: usage.cache_read_tokens,
            CACHE_WRITE_TOKENS: usage.cache_write_tokens,
            REASONING_TOKENS: usage.reasoning_tokens,
        }
    )


def _current(span: trace.Span) -> AbstractContextManager[trace.Span]:
    """Make ``span`` current while the block runs, and end it after. How it ended is
    reported by the engine, so an exception passing through (a park, a cancel) is
    not taken for an error."""
    return trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    )


def _fail(span: trace.Span, error_type: str, message: str | None) -> None:
    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(trace.Status(trace.StatusCode.ERROR, message))


def _span_context(carrier: Mapping[str, str] | None) -> trace.SpanContext | None:
    """The span a stored context names, if it names a valid one."""
    if not carrier:
        return None
    found = trace.get_current_span(_W3C.extract(dict(carrier))).get_span_context()
    return found if found.is_valid else None


def _model_name(model: object) -> str | None:
    """The name of the model an adapter asks for (its ``model`` attribute), if any."""
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None
