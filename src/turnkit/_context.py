"""``ToolContext``: everything a tool may reach while it runs, and nothing more."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import FatalToolError
from ._inbound import InboundEvent

if TYPE_CHECKING:
    from ._agent import Agent
    from ._runtime import Runtime
    from ._store import StoreHandle


class NoHandle:
    """``ctx.store`` where no transaction is open: remote tools, and the memory store."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def unwrap(self) -> None:
        return None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # A deployment mistake the model cannot correct, so it fails the turn.
        raise FatalToolError(f"ctx.store.execute is unavailable: {self._reason}")


def make_idempotency_key(session_id: str, turn_id: str, step_id: str) -> str:
    """Stable for one call across replays; different for every other call, turn and session."""
    digest = hashlib.sha256(f"{session_id}\x00{turn_id}\x00{step_id}".encode()).hexdigest()
    return f"tk-{digest[:40]}"


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What the engine hands a tool's ``run`` besides the model's input.

    ``store`` joins the step's transaction in a local tool; ``idempotency_key``
    is what a remote tool passes to a remote service so a replayed call is
    deduplicated there.
    """

    store: StoreHandle
    agent: Agent
    session_id: str
    turn_id: str
    call_id: str
    event: InboundEvent | None
    runtime: Runtime | None
    step_id: str

    @property
    def idempotency_key(self) -> str:
        """Stable across replays of this call; pass it to remote services to dedupe on."""
        return make_idempotency_key(self.session_id, self.turn_id, self.step_id)
