"""The library's exceptions, in three families under one base.

TurnkitError
├── FatalToolError            raised by a tool to fail the turn on purpose
├── RetryableError            raised by a tool whose call should be tried again later
├── ConfigurationError        a developer's mistake in assembly or setup
│   └── ToolDefinitionError   a tool that cannot be declared or classified
└── TurnError                 a run or protocol failure seen by a caller
    ├── TurnFailedError       ``session.turn()`` of a turn that failed
    ├── TurnSuspendedError    ``session.turn()`` of a turn that parked for input
    ├── TurnCancelledError    ``session.turn()`` of a turn that was cancelled
    ├── TurnHeldError         ``session.turn()`` of a turn another agent version held
    ├── SessionSuspendedError a new turn on a session parked on another one
    ├── SessionOwnerError     a turn on a session another owner opened
    ├── ResumeConflictError   a resume for the wrong turn, input or state
    ├── ResumeAuthorizationError  a resume by someone who may not answer
    ├── InvalidAnswerError    a resume whose answer breaks the request's schema
    ├── ModelError            an adapter's failure (SDK error, broken stream)
    │   ├── ModelOverloadedError  the provider refused for load (429, 503, 529)
    │   └── ContextWindowError  the request was longer than the model's context window
    ├── StoreError            the store refused or lost a write, or holds unreadable data
    │   ├── TurnMoveError     a turn move the rules forbid, or one another process beat
    │   ├── WriteConflictError  a position, step, event or turn another writer took first
    │   │   └── GenerationArchivedError  a reset's archive another reset carried out first
    │   └── SessionBusyError  another process holds the session's writer lock
    │       └── FencedError   a late commit of a delivery another process took over
    ├── MessageDecodeError    stored or wire JSON that is not a message
    ├── SessionFileError      an exported session file that cannot be read
    └── DeliveryError         a channel failed to render a turn (the turn still ran)

Three public exceptions live beside what raises them, outside the tree on purpose:
``turnkit.SubagentError`` and ``turnkit.a2a.A2AAgentError`` (a plain ``Exception``:
a child's or a remote agent's failure, raised inside a tool, so the parent's model
reads it as the call's error) and ``turnkit.testing.ReplayDivergenceError`` (an
``AssertionError``: a replayed session that went another way fails a test).
"""

from __future__ import annotations

from typing import Any


class TurnkitError(Exception):
    """Base class of every exception turnkit raises on its own behalf."""


class FatalToolError(TurnkitError):
    """Raised by a tool to fail the whole turn instead of returning an error result.

    Use it for what the model cannot fix by retrying: a misconfigured deployment,
    a broken invariant. Any other exception becomes a result the model reads.
    """


class RetryableError(TurnkitError):
    """Raised by a tool when its call failed for a passing reason and should be tried
    again later (a rate limit, a service that is down): the turn parks on a timer
    for ``retry_after`` seconds (or the tool's ``Retry`` backoff) and the call runs
    again, up to the attempts its ``Retry`` allows (3 without one); then the
    message is the call's error result, for the model to read."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        if retry_after is not None and (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, int | float)
            or retry_after < 0
        ):
            raise ValueError(f"retry_after must be seconds >= 0, got {retry_after!r}")
        self.retry_after = None if retry_after is None else float(retry_after)


class ConfigurationError(TurnkitError):
    """The application assembled turnkit wrongly (unknown agent, bad option, …)."""


class ToolDefinitionError(ConfigurationError):
    """A tool's declaration is unusable: bad name, unsupported signature, …"""


class TurnError(TurnkitError):
    """A turn could not run or finish as asked."""


class TurnFailedError(TurnError):
    """The awaited turn ended in the ``failed`` state; ``error`` says why."""

    def __init__(self, turn_id: str, error: str) -> None:
        super().__init__(f"turn {turn_id} failed: {error}")
        self.turn_id = turn_id
        self.error = error


class TurnCancelledError(TurnError):
    """The awaited turn was cancelled; ``reason`` is ``requested``, ``replaced`` or ``reset``."""

    def __init__(self, turn_id: str, reason: str) -> None:
        super().__init__(f"turn {turn_id} was cancelled ({reason})")
        self.turn_id = turn_id
        self.reason = reason


class TurnHeldError(TurnError):
    """The awaited turn is held: a delivery of another agent version refused to run
    what it recorded, and left it parked (``reason`` says why; docs/deploying.md)."""

    def __init__(self, turn_id: str, reason: str) -> None:
        super().__init__(f"turn {turn_id} is held: {reason}")
        self.turn_id = turn_id
        self.reason = reason


class TurnSuspendedError(TurnError):
    """The awaited turn parked on an input request; ``request`` says what it waits for
    (``requests``: every open question, when several calls of a step asked).

    Answer it with ``await session.resume(turn_id, request.id, value, by=...)``, and
    each of ``requests`` likewise.
    """

    def __init__(self, turn_id: str, request: Any, requests: tuple[Any, ...] = ()) -> None:
        more = f" (and {len(requests) - 1} more)" if len(requests) > 1 else ""
        super().__init__(
            f"turn {turn_id} is waiting for input {request.id!r}: {request.prompt}{more}"
        )
        self.turn_id = turn_id
        self.request = request
        self.requests = tuple(requests) or (request,)


class SessionSuspendedError(TurnError):
    """A new turn was started while the session waits on a parked turn's input.

    One park at a time: resume (or reset) the parked turn first.
    """


class SessionOwnerError(TurnError):
    """A turn was started for one owner on a session another owner opened (see
    ``AgentSession.start(owner=…)``). Nothing was stored; the session stays its
    owner's."""


class ResumeConflictError(TurnError):
    """A resume that does not fit the session: wrong turn, wrong input id, or the
    session is not parked. Nothing was stored."""


class ResumeAuthorizationError(TurnError):
    """A resume by someone the request's answerers do not admit. Nothing was stored."""


class InvalidAnswerError(TurnError, ValueError):
    """A resume's answer does not match the request's schema. Nothing was stored."""


class ModelError(TurnError):
    """A model adapter's failure (an SDK error, a broken stream), raised from ``stream``.

    The engine records it as the turn's error text (``model error: …``); callers see
    a failed ``TurnResult``, not this exception.
    """


class ModelOverloadedError(ModelError):
    """The provider refused the call for load (HTTP 429, 503, 529), saying when to
    come back (``retry_after``, seconds) or not. The engine parks the turn on a
    timer until then and asks again (``Agent(model_retry=...)``), holding no worker."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ContextWindowError(ModelError):
    """The provider refused the request, or stopped, because it was longer than the
    model's context window. The turn fails with a message naming the remedy (a
    history policy, ``Agent(history=...)``)."""


class StoreError(TurnError):
    """The session store refused a write or holds data it cannot read."""


class TurnMoveError(StoreError):
    """A turn's status move refused: the rules forbid it (a finished turn cannot run
    again), or the turn was not in the status the move was planned from (another
    process moved it first, or it does not exist). Nothing of the commit was kept."""


class WriteConflictError(StoreError):
    """A commit refused because the session already holds what it writes: a
    transcript position, a step id, an event number or a turn id taken, because
    another writer advanced the session first. Nothing of the commit was kept;
    read the session again before deciding what to write."""


class GenerationArchivedError(WriteConflictError):
    """A reset's archive refused because the generation was archived already (another
    reset came first): the session is in a new generation, and nothing was kept."""


class SessionBusyError(StoreError):
    """Another process kept the session's single-writer lock past the wait limit.

    Nothing was written; the turn can be delivered again once the other writer is done.
    """


class FencedError(SessionBusyError):
    """A commit refused because another process took the session over (its writer
    lock and fencing token) since this delivery began: the step was not written,
    and the new owner carries the turn on. Expected after a pause or a lost
    connection, not a crash."""


class MessageDecodeError(TurnError, ValueError):
    """A JSON object is not a valid turnkit message, event or reply."""


class SessionFileError(TurnError, ValueError):
    """An exported session (``turnkit export``'s JSON) that cannot be imported or
    replayed; the message names the first field that is wrong."""


class DeliveryError(TurnError):
    """A channel failed to render a turn; the turn itself still ran (or runs) to its end.

    ``method`` is the platform call that failed (``chat.update``) and ``code`` the
    platform's own error code (``channel_not_found``), when the channel knows them:
    a channel translates its SDK's error into this one at the call.
    """

    def __init__(self, message: str, *, method: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.method = method
        self.code = code
