"""What the runner's collaborators may see of a delivery: its position and its commits.

``TurnRunner`` owns the delivery's state; the modules that build its tool steps and
state changes take it through this protocol, so none of them imports the runner.
Every field is read-only here: the state changes only through the methods that
say what landed (``commit``, ``landed``, ``remember``, ``use_tools``), so a
collaborator cannot leave the transcript, the step results and ``next_seq``
disagreeing with what the store holds.

``course`` is what a delivery does with the turn it read, decided once from the
stored record's status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, TypeAlias

from .._errors import StoreError
from .._seams.store import SessionStore
from .._seams.tracer import StepSpan, TurnSpan
from .._values.budgets import Budget
from .._values.events import TurnEvent
from .._values.inbound import InboundEvent
from .._values.messages import Message, ToolCall
from .._values.policy import TurnPolicy
from .._values.records import TurnRecord, refused_by
from .._values.usage import Usage
from .._values.writes import Write
from .agent import Agent
from .context import ChildTurns
from .rate_waits import RateLimiter
from .turn_tools import TurnTools


class Delivery(Protocol):
    """One delivery of one turn as its collaborators use it: read-only fields, and
    the methods through which what a commit stored becomes the delivery's state."""

    @property
    def agent(self) -> Agent: ...
    @property
    def store(self) -> SessionStore: ...
    @property
    def turn_id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def event(self) -> InboundEvent | None: ...
    @property
    def tenant(self) -> str:
        """Whose turn it is (``TurnRecord.tenant``): the stored turn's once stored."""
        ...

    @property
    def budget(self) -> Budget | None:
        """Spending limits checked before each model step (``None``: none, no ledger)."""
        ...

    @property
    def rates(self) -> RateLimiter | None:
        """The model rate limits each model step takes a place under (``None``: none)."""
        ...

    @property
    def children(self) -> ChildTurns | None: ...
    @property
    def generation(self) -> int: ...
    @property
    def store_id(self) -> str: ...
    @property
    def policy(self) -> TurnPolicy: ...
    @property
    def record(self) -> TurnRecord | None:
        """The turn as last stored (``None`` until its opening commit lands): what its
        next status move is planned from (see ``turn_rules.move``)."""
        ...

    @property
    def tools(self) -> TurnTools: ...
    @property
    def transcript(self) -> Sequence[Message]: ...
    @property
    def steps(self) -> Mapping[str, Any]: ...
    @property
    def next_seq(self) -> int: ...
    @property
    def attempt(self) -> str: ...
    @property
    def span(self) -> TurnSpan: ...
    @property
    def usage(self) -> Usage: ...

    def step_span(
        self, step_id: str, *, call: ToolCall | None = None, model: Any = None
    ) -> AbstractContextManager[StepSpan]: ...

    async def commit(
        self,
        writes: Sequence[Write],
        events: list[TurnEvent],
        messages: Sequence[Message] = (),
        used: Usage | None = None,
    ) -> None:
        """Commit ``writes`` and ``events``; once stored, the transcript gains
        ``messages``, the events are emitted and ``used`` joins the turn's usage."""
        ...

    def landed(
        self, step_id: str, result: Any, messages: Sequence[Message], event: TurnEvent
    ) -> None:
        """A tool step the store committed itself (``run_tool``): its result, the
        messages it added and its one event become the delivery's."""
        ...

    def remember(self, step_id: str, result: Any) -> None:
        """A step result this delivery committed (on its own) is one it has."""
        ...

    def use_tools(self, tools: TurnTools) -> None:
        """The turn's tools, once its tool sources were listed."""
        ...

    def add_usage(self, used: Usage) -> None:
        """Model calls made outside a step's commit (history summaries) used ``used``."""
        ...

    def emit(self, event: TurnEvent) -> None: ...

    def cancel_reason(self) -> str | None: ...

    def boundary(self) -> None: ...

    async def step_boundary(self) -> None: ...

    async def poll_cancel(self) -> str | None: ...


#: What a delivery does with the turn it read: open it (new, or queued); run it on
#: (running, or held by versions other than this one); run a failed one again;
#: end a parked one whose cancellation is recorded; settle a queued one that was
#: cancelled before it opened; or only say again how it ended (finished, parked
#: without an answer, or superseded by a later turn).
Course: TypeAlias = Literal["open", "run", "reopen", "cancel", "settle", "announce"]


def course(record: TurnRecord | None, *, opened: bool, version: str, cancel: str | None) -> Course:
    """What a delivery of ``version`` does with the stored ``record`` (``None``: not
    stored); ``opened``: its opening message is in the transcript (a turn stored but
    not opened is queued, or was superseded by a later one); ``cancel``: the
    cancellation asked for, if any."""
    if record is None:
        return "open"
    match record.status:
        case "queued":
            return "open" if cancel is None else "settle"
        case _ if not opened:
            return "announce"  # superseded: a later turn opened after it
        case "suspended" if cancel is not None:
            return "cancel"  # a parked turn ends where it waits
        case "suspended" if record.held_by is not None and not refused_by(record, version):
            return "run"  # held by other versions of the agent, not by this one
        case "completed" | "suspended" | "cancelled":
            return "announce"
        case "failed":
            return "reopen"
        case _:  # running: a delivery died under it, so carry on where it stopped
            return "run"


def stored_turn(d: Delivery) -> TurnRecord:
    """The delivery's turn as last stored: what its next move is planned from."""
    if d.record is None:
        raise StoreError(f"session {d.session_id}: turn {d.turn_id} is not stored yet")
    return d.record
