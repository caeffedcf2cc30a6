"""What the runner's collaborators may see of a delivery: its position and its commits.

``TurnRunner`` owns the delivery's state; the modules that build its tool steps and
state changes take it through this protocol, so none of them imports the runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .._errors import StoreError
from .._seams.store import SessionStore
from .._seams.tracer import StepSpan, TurnSpan
from .._values.budgets import Budget
from .._values.events import TurnEvent
from .._values.inbound import InboundEvent
from .._values.messages import Message, ToolCall
from .._values.policy import TurnPolicy
from .._values.records import TurnRecord
from .._values.usage import Usage
from .._values.writes import Write
from .agent import Agent
from .context import ChildTurns
from .rate_waits import RateLimiter
from .turn_tools import TurnTools


class Delivery(Protocol):
    """One delivery of one turn as its collaborators use it. The transcript, the
    step results and ``next_seq`` change only through ``commit`` (or, for a tool
    step, right after its own commit)."""

    agent: Agent
    store: SessionStore
    turn_id: str
    session_id: str
    event: InboundEvent | None
    #: Whose turn it is (``TurnRecord.tenant``): the stored turn's once it is stored.
    tenant: str
    #: Spending limits checked before each model step (``None``: none, no ledger).
    budget: Budget | None
    #: The model rate limits each model step takes a place under (``None``: none).
    rates: RateLimiter | None
    children: ChildTurns | None
    generation: int
    store_id: str
    policy: TurnPolicy
    #: The turn as last stored (``None`` until its opening commit lands): what its
    #: next status move is planned from (see ``turn_rules.move``).
    record: TurnRecord | None
    tools: TurnTools
    transcript: list[Message]
    steps: dict[str, Any]
    next_seq: int
    attempt: str
    span: TurnSpan
    usage: Usage

    def step_span(
        self, step_id: str, *, call: ToolCall | None = None, model: Any = None
    ) -> AbstractContextManager[StepSpan]: ...

    async def commit(
        self,
        writes: Sequence[Write],
        events: list[TurnEvent],
        messages: Sequence[Message] = (),
    ) -> None: ...

    def emit(self, event: TurnEvent) -> None: ...

    def cancel_reason(self) -> str | None: ...

    def boundary(self) -> None: ...

    async def step_boundary(self) -> None: ...

    async def poll_cancel(self) -> str | None: ...


def stored_turn(d: Delivery) -> TurnRecord:
    """The delivery's turn as last stored: what its next move is planned from."""
    if d.record is None:
        raise StoreError(f"session {d.session_id}: turn {d.turn_id} is not stored yet")
    return d.record
