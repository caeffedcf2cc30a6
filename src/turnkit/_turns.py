"""A turn's delivery and outcome as values: what the runtime hands the engine and gets back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ._inbound import InboundEvent
from ._inputs import InputRequest
from ._messages import OpeningMessage
from ._store import TurnRecord


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """One delivery of a turn: its id, its opening message and where it came from."""

    turn_id: str
    opening: OpeningMessage
    event: InboundEvent | None = None


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """How a turn ended: ``completed`` with ``text``, ``failed`` with ``error``, or
    ``suspended`` (parked) with the ``request`` it waits on."""

    turn_id: str
    status: Literal["completed", "failed", "suspended"]
    text: str | None = None
    error: str | None = None
    request: InputRequest | None = None


class TurnFailure(Exception):
    """Internal: ends the turn as failed, recorded, with this message."""


def result_from_record(record: TurnRecord) -> TurnResult:
    if record.status == "completed":
        return TurnResult(turn_id=record.turn_id, status="completed", text=record.text or "")
    if record.status == "suspended" and record.pending is not None:
        return TurnResult(
            turn_id=record.turn_id,
            status="suspended",
            request=InputRequest.from_dict(record.pending["request"]),
        )
    return TurnResult(turn_id=record.turn_id, status="failed", error=record.error or "failed")
