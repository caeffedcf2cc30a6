"""Durable retries of a tool call: ``Retry`` says how often and how long apart, and a
failed attempt parks the turn on a timer instead of holding a process while it waits.

Each wait is a ``timer`` request with the id ``retry:<step id>:<n>`` (``n``: the
failures so far), so the attempts a call has made are the answered ones among them:
counted again from the stored steps on every delivery, the same in every process.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .._errors import ConfigurationError, ModelOverloadedError, RetryableError
from .._values.inputs import Expiry, InputRequest
from .._values.step_ids import call_input_id, input_step_id
from .context import ToolContext


def _seconds(value: object, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise ConfigurationError(f"Retry {name} must be seconds >= 0 or a timedelta, got {value!r}")
    return float(seconds)


@dataclass(frozen=True)
class Retry:
    """How a tool call that failed is tried again: up to ``attempts`` runs in all,
    the n-th wait ``backoff * 2**(n-1)`` seconds (a ``RetryableError``'s
    ``retry_after`` instead, when it gives one), at most ``max_backoff``. Which
    failures: a ``RetryableError`` always, and any exception of the types in ``on``.
    Anything else is the call's error result at once, for the model to read."""

    attempts: int = 3
    backoff: float | timedelta = 1.0
    max_backoff: float | timedelta = 300.0
    on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigurationError(f"Retry attempts must be an int, got {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigurationError(f"Retry attempts must be 1 or more, got {self.attempts}")
        _seconds(self.backoff, "backoff")
        _seconds(self.max_backoff, "max_backoff")
        on = self.on if isinstance(self.on, tuple) else (self.on,)
        for kind in on:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise ConfigurationError(f"Retry on= takes exception types, got {kind!r}")
        object.__setattr__(self, "on", on)

    def applies(self, exc: BaseException) -> bool:
        return isinstance(exc, (RetryableError, *self.on))

    def delay(self, failures: int, exc: BaseException) -> float:
        """Seconds to wait after the ``failures``-th failure, ``exc``."""
        if isinstance(exc, RetryableError) and exc.retry_after is not None:
            return exc.retry_after
        first = _seconds(self.backoff, "backoff")
        return float(min(first * 2 ** (failures - 1), _seconds(self.max_backoff, "max_backoff")))


#: The policy of a tool that has none but raised ``RetryableError``.
DEFAULT_RETRY = Retry()
#: The policy of an agent that has none, for a model call refused for load.
MODEL_RETRY = Retry(attempts=5, backoff=10.0)


def retry_wait(
    retry: Retry | None, exc: BaseException, ctx: ToolContext, steps: Mapping[str, Any]
) -> InputRequest | None:
    """The timer the call of ``ctx`` waits on before its next attempt, having failed
    with ``exc``; ``None`` when it is not to be tried again (not a failure ``retry``
    covers, or its attempts are spent)."""
    policy = retry if retry is not None else DEFAULT_RETRY
    if not policy.applies(exc):
        return None
    failures = 1 + answered(ctx, steps)
    if failures >= policy.attempts:
        return None
    now = time.time()
    return InputRequest(
        id=retry_id(ctx.step_id, failures),
        prompt=(
            f"attempt {failures} of {policy.attempts} of {ctx.tool_name!r} failed "
            f"({type(exc).__name__}: {exc}); trying again"
        ),
        turn_id=ctx.turn_id,
        call_id=ctx.call_id,
        tool=ctx.tool_name,
        kind="timer",
        expires_at=now + policy.delay(failures, exc),
        on_expiry=Expiry(action="answer", value=None),
        asked_at=now,
    )


def answered(ctx: ToolContext, steps: Mapping[str, Any]) -> int:
    """How many of the call's retry waits have ended: the attempts before this one."""
    n = 0
    while _waited(ctx, steps, retry_id(ctx.step_id, n + 1)):
        n += 1
    return n


def _waited(ctx: ToolContext, steps: Mapping[str, Any], timer_id: str) -> bool:
    own = input_step_id(ctx.turn_id, call_input_id(timer_id, ctx.call_id))
    return own in steps or input_step_id(ctx.turn_id, timer_id) in steps


_PREFIX = "retry:"


def retry_id(step_id: str, failures: int) -> str:
    return f"{_PREFIX}{step_id}:{failures}"


def retry_waits(requests: Iterable[InputRequest]) -> Iterator[tuple[InputRequest, str, int]]:
    """Among a park's ``requests``, the retry waits: each with its call's step id and
    the failures so far."""
    for request in requests:
        if request.kind != "timer" or not request.id.startswith(_PREFIX):
            continue
        step_id, _, failures = request.id[len(_PREFIX) :].rpartition(":")
        if step_id and failures.isdigit():
            yield request, step_id, int(failures)


def model_retry_wait(
    retry: Retry | None,
    exc: ModelOverloadedError,
    *,
    turn_id: str,
    step_id: str,
    steps: Mapping[str, Any],
) -> InputRequest | None:
    """The timer a model step (``step_id``) the provider refused for load waits on
    before it asks again; ``None`` once the agent's ``model_retry`` is spent."""
    policy = retry if retry is not None else MODEL_RETRY
    failures = 1
    while input_step_id(turn_id, retry_id(step_id, failures)) in steps:
        failures += 1
    if failures >= policy.attempts:
        return None
    now = time.time()
    delay = exc.retry_after if exc.retry_after is not None else policy.delay(failures, exc)
    return InputRequest(
        id=retry_id(step_id, failures),
        prompt=f"attempt {failures} of {policy.attempts} of the model call failed ({exc})",
        turn_id=turn_id,
        call_id="",
        tool="",
        kind="timer",
        expires_at=now + delay,
        on_expiry=Expiry(action="answer", value=None),
        asked_at=now,
    )
