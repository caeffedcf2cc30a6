"""A turn's delivery and outcome as values: what the runtime hands the engine and gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from .._values.records import TurnRecord
from .events import TurnEvent
from .inbound import InboundEvent
from .inputs import InputRequest
from .messages import OpeningMessage
from .policy import TurnPolicy
from .usage import NO_USAGE, Usage

_T = TypeVar("_T")


class CancelSignal:
    """Set by ``session.cancel()`` (or a replace, or a reset); read by the engine at
    each checkpoint boundary. The first reason given is the one that counts."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """One delivery of a turn: its id, its opening message and where it came from."""

    turn_id: str
    opening: OpeningMessage
    event: InboundEvent | None = None
    #: Where a turn without an inbound event came from (a proactive turn's channel).
    source: str | None = None
    #: The policy a resumed turn's suspend checkpoint carried.
    policy: TurnPolicy | None = None
    #: Tools a new turn may not use whatever its agent allows (a child turn gets
    #: its parent turn's denials).
    inherited_deny: frozenset[str] = frozenset()
    #: Events already logged for this turn that its delivery tells observers first
    #: (a resume's ``input.answered``); a redelivery of the turn carries none.
    announce: tuple[TurnEvent, ...] = ()
    #: Who opens the turn (a principal's id): a new session is recorded as theirs,
    #: and a session another owner opened refuses the turn. ``None``: trusted code,
    #: which claims nothing.
    owner: str | None = None
    #: Submitted durably: the store held the turn as ``queued`` before this delivery
    #: was asked for, so finding no record means a reset archived it meanwhile.
    queued: bool = False
    #: The trace context of the code that asked for this delivery (W3C Trace Context
    #: headers), so its spans sit under that code's span wherever the turn runs.
    trace: dict[str, str] | None = None
    #: The tenant the turn is stored under (``TurnRecord.tenant``): ``""``, the default.
    tenant: str = ""
    #: A subagent's child turn, run inside its parent's tool call: it takes no
    #: tenant slot of its own (its parent's holds one already).
    child: bool = False
    #: Taken from the shared queue by a claim: the claim takes a session's oldest
    #: runnable turn, so no older turn of the session can be left running, and the
    #: delivery does not read the session's unfinished turns to look for one.
    claimed: bool = False
    cancel: CancelSignal = field(default_factory=CancelSignal, compare=False)


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """How a turn ended: ``completed`` with ``text``, ``failed`` with ``error``,
    ``suspended`` (parked) with the ``request`` it waits on (``requests``: every
    question still open, in call order, when several calls of a step asked), or
    ``cancelled`` with its ``reason`` (``requested``, ``replaced``, ``reset``). A turn
    held by another agent version is ``suspended`` with no ``request`` and its
    ``error`` saying why (see docs/deploying.md).

    For an agent with an ``output_type``, a completed turn's ``text`` is its
    answer's JSON and ``output`` the answer parsed into that type. ``usage`` sums
    the tokens of every model call the turn stored, in every delivery of it."""

    turn_id: str
    status: Literal["completed", "failed", "suspended", "cancelled"]
    text: str | None = None
    error: str | None = None
    request: InputRequest | None = None
    reason: str | None = None
    usage: Usage = NO_USAGE
    output: Any = None
    requests: tuple[InputRequest, ...] = ()

    def __post_init__(self) -> None:
        if self.request is not None and not self.requests:
            object.__setattr__(self, "requests", (self.request,))

    def output_as(self, output_type: type[_T]) -> _T:
        """``output``, typed as ``output_type`` for the type checker and checked to be
        one (a ``TypedDict`` is checked to be a dict): ``result.output_as(Invoice)``."""
        if self.output is None:
            raise ValueError(
                f"turn {self.turn_id} has no typed output (it is {self.status}, or its "
                "agent has no output_type)"
            )
        # A TypedDict (typing's or typing_extensions') allows no isinstance check.
        typed_dict = hasattr(output_type, "__required_keys__")
        kind: type = dict if typed_dict else output_type
        if not isinstance(self.output, kind):
            raise TypeError(
                f"turn {self.turn_id}'s output is a {type(self.output).__name__}, "
                f"not a {getattr(output_type, '__name__', output_type)}"
            )
        return cast(_T, self.output)  # checked just above (a TypedDict as a dict)


@dataclass(frozen=True, kw_only=True)
class ResetResult:
    """What ``session.reset()`` did.

    ``previous_session`` names the archived generation (``"s1#g0"``) and
    ``archived_generation`` is its number, readable with
    ``session.archived_messages(archived_generation)``; both are ``None`` when the
    session held nothing, which archives nothing. ``generation`` is the live
    generation from now on (what the session's transcript reports).
    """

    previous_session: str | None
    archived_generation: int | None
    generation: int


class TurnFailure(Exception):
    """Internal: ends the turn as failed, recorded, with this message."""


class TurnCancelled(Exception):
    """Internal: a cancellation reached a checkpoint boundary; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def result_from_record(record: TurnRecord, usage: Usage = NO_USAGE) -> TurnResult:
    """How the stored turn ended; ``usage`` is what its stored steps used."""
    tid = record.turn_id
    match record.status:
        case "completed":
            return TurnResult(turn_id=tid, status="completed", text=record.text or "", usage=usage)
        case "cancelled":
            reason = record.cancel_reason or "requested"
            return TurnResult(turn_id=tid, status="cancelled", reason=reason, usage=usage)
        case "suspended" if record.pending is not None:
            requests = record.pending.requests
            return TurnResult(
                turn_id=tid, status="suspended", request=requests[0], requests=requests, usage=usage
            )
        case "suspended":  # held by a version (``TurnRecord.held_by``)
            return TurnResult(turn_id=tid, status="suspended", error=record.error, usage=usage)
        case _:
            error = record.error or "failed"
            return TurnResult(turn_id=tid, status="failed", error=error, usage=usage)
