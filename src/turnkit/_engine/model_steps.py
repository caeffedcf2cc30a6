"""A model step: send the turn's window to the model, stream its reply, commit it.

The reply commits in one transaction with what follows it (a typed answer's result,
the turn's completion), so a replay either finds the whole step or asks again.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from .._seams.tracer import StepSpan
from .._values.checkpoints import ToolStepResult
from .._values.events import MessageDeltaEvent, ReasoningDeltaEvent
from .._values.frozen import made_clean
from .._values.inputs import InputRequest
from .._values.messages import ToolMessage
from .._values.step_ids import model_step_id, tool_step_id
from .._values.text import storable
from .._values.turn_rules import move
from .._values.writes import AppendMessage, PutStep, Write
from .context_window import ContextWindows
from .delivery import Delivery, stored_turn
from .known_transcript import KnownTranscript
from .model_call import ModelBusy, Sent, ask_model
from .output import answer_tail
from .rate_waits import Ticket
from .replies import assistant_message, error_of, reply_events
from .retries import model_retry_wait
from .spending import check_budget, count_usage
from .tool_steps import Park
from .tracing import UNTRACED, UNTRACED_SPAN
from .transcript_view import TranscriptView

#: A delta's event, its text made storable by the caller (see ``_text_delta``).
_delta = made_clean(MessageDeltaEvent)


class ModelSteps:
    """Runs the model steps of one delivery, sharing its history window across them."""

    def __init__(self, delivery: Delivery, known: KnownTranscript | None) -> None:
        self._d = delivery
        self._known = known
        self._windows: ContextWindows | None = None

    async def step(self, index: int) -> None:
        """Ask the model for the message at ``index`` and commit its reply."""
        d = self._d
        # A step's result commits with its message, so this step was never answered.
        step_id = model_step_id(index)
        if d.budget is not None and d.budget.limited:
            await check_budget(d, d.budget, step_id)
        # The history policy's summary calls are steps of their own, with spans of
        # their own, made before this step's request (and its span) begins.
        windows = self._context_windows()
        if d.agent.history is None:  # the whole transcript, no summary calls: not awaited
            sent = Sent(messages=TranscriptView(d.transcript, 0, index), system=d.policy.system)
        else:
            sent = await windows.prepare(d.transcript, index, d.policy.system)
            summaries = windows.take_usage()  # what the summaries it made used
            if summaries is not None:
                d.add_usage(summaries)
        traced = d.step_span(step_id, model=d.agent.model)
        if traced is UNTRACED:
            await self._ask_and_commit(index, step_id, UNTRACED_SPAN, windows, sent)
            return
        with traced as span:
            await self._ask_and_commit(index, step_id, span, windows, sent)

    async def _ask_and_commit(
        self,
        index: int,
        step_id: str,
        span: StepSpan,
        windows: ContextWindows,
        sent: Sent,
    ) -> None:
        d = self._d
        ticket: Ticket | None = None
        if d.rates is not None:
            # Taken right before the call, so nothing between could leave it unended.
            taken = await d.rates.take(
                d.agent.model, turn_id=d.turn_id, step_id=step_id, steps=d.steps
            )
            if isinstance(taken, InputRequest):
                raise Park((taken,))  # asked again when a place frees (nothing was asked)
            ticket = taken
        used = 0
        try:
            reply, record = await ask_model(
                d.agent,
                sent,
                self._text_delta,
                self._reasoning_delta,
                d.cancel_reason,
                tools=d.tools.specs_for(d.policy),
            )
            used = reply.usage.total_tokens if reply.usage is not None else 0
        except ModelBusy as busy:
            if d.rates is not None and busy.error.retry_after is not None:
                # Every process holds back from this model until the provider's time.
                await d.rates.refused(d.agent.model, busy.error.retry_after)
            wait = model_retry_wait(
                d.agent.model_retry, busy.error, turn_id=d.turn_id, step_id=step_id, steps=d.steps
            )
            if wait is None:
                raise
            raise Park((wait,)) from None  # asked again when the timer fires
        finally:
            if ticket is not None and d.rates is not None:
                # However the call ended: its window at the provider runs from now.
                await d.rates.done(ticket, used)
        span.replied(reply)
        message = assistant_message(reply, d.turn_id, reply.tool_calls)
        # What follows the reply in the same commit (a typed answer's result, or a
        # refused one's error), and the turn's answer if this step ends it.
        tail, answer = answer_tail(
            d.agent._output,
            reply,
            d.transcript,
            d.turn_id,
            d.agent.model,
        )
        tid = d.turn_id
        events = reply_events(
            reply,
            message,
            tail,
            answer,
            turn_id=tid,
            session_id=d.session_id,
            first_seq=d.next_seq,
        )

        writes: list[Write] = [
            PutStep(step_id, tid, record),
            *windows.writes(),
            AppendMessage(index, message),
        ]
        for offset, later in enumerate(tail, start=1):
            if isinstance(later, ToolMessage):
                stored = ToolStepResult(result=later.result, error=error_of(later))
                writes.append(PutStep(tool_step_id(index, later.call_id), tid, stored.to_dict()))
            writes.append(AppendMessage(index + offset, later))
        if answer is not None:
            writes.append(move(stored_turn(d), "completed", text=answer))
        if d.budget is not None and reply.usage is not None:
            writes.append(count_usage(d.budget, d.tenant, d.agent.model, reply.usage))
        # Right before the commit: a cancel that arrived after the last delta or while
        # the stream closed still wins (nothing of the step is written).
        d.boundary()
        await d.commit(writes, events, [message, *tail], reply.usage)
        cache = windows.committed()
        if self._known is not None:
            self._known.window = cache

    def _context_windows(self) -> ContextWindows:
        """This delivery's use of the agent's history policy (made on first use)."""
        d = self._d
        if self._windows is None:
            self._windows = ContextWindows(
                agent=d.agent,
                store=d.store,
                turn_id=d.turn_id,
                generation=d.generation,
                steps=d.steps,
                remember=d.remember,
                cache=self._known.window if self._known is not None else None,
                boundary=d.step_boundary,
                cancelled=d.cancel_reason,
                # (Bound to the delivery, not to these steps: the windows are kept
                # here, and a method of ours would make a reference cycle.)
                traced=partial(_summary_span, d),
            )
        return self._windows

    def _text_delta(self, text: str) -> None:
        d = self._d
        # Made storable here (a reply streams many deltas; the event's own check
        # would cost two calls more each), or by the event itself if not a str.
        make = _delta if type(text) is str else MessageDeltaEvent
        d.emit(
            make(
                turn_id=d.turn_id,
                session_id=d.session_id,
                text=storable(text) if make is _delta else text,
                next_seq=d.next_seq,
                attempt=d.attempt,
            )
        )

    def _reasoning_delta(self, text: str) -> None:
        d = self._d
        d.emit(
            ReasoningDeltaEvent(
                turn_id=d.turn_id,
                session_id=d.session_id,
                text=text,
                next_seq=d.next_seq,
                attempt=d.attempt,
            )
        )


def _summary_span(d: Delivery, step_id: str, model: Any) -> AbstractContextManager[StepSpan]:
    """The span of a summary call the history policy makes (step ``step_id``)."""
    return d.step_span(step_id, model=model)
