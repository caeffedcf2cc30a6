"""The turn's state machine, as pure functions: the one place its rules live.

Which status may follow which, what a turn keeps when it moves, what its session's
status becomes, and which cancellation reason counts are decided here, by the
engine, before anything is written. A store is handed the outcome as a
``PutTurn`` write (the new record and the status it must still be in) and applies
it with a compare-and-set; it knows none of these rules, so a new store cannot get
them wrong and a rule changes in one place.
"""

from __future__ import annotations

import time
from types import MappingProxyType

from .._errors import TurnMoveError
from .checkpoints import SuspendCheckpoint
from .frozen import replaced
from .records import TERMINAL_TURN_STATUSES as TERMINAL
from .records import SessionStatus, TurnRecord, TurnStatus
from .writes import PutTurn

#: The statuses of a turn that has not ended.
UNFINISHED: frozenset[TurnStatus] = frozenset({"queued", "running", "suspended"})

#: For each status a turn is in (``None``: not stored yet), the ones it may move to.
#: A queued turn opens or is settled without running; a running one parks, ends or
#: is superseded; a parked one runs on once answered, stays parked on the questions
#: still open, or is cancelled where it waits; a failed turn may be delivered again.
#: ``completed`` and ``cancelled`` are final.
MOVES: MappingProxyType[TurnStatus | None, frozenset[TurnStatus]] = MappingProxyType(
    {
        None: frozenset({"queued", "running"}),
        "queued": frozenset({"running", "cancelled", "failed"}),
        "running": frozenset({"suspended", "completed", "failed", "cancelled"}),
        "suspended": frozenset({"running", "suspended", "failed", "cancelled"}),
        "failed": frozenset({"running"}),
        "completed": frozenset(),
        "cancelled": frozenset(),
    }
)


def may_follow(current: TurnStatus | None, status: TurnStatus) -> bool:
    """Whether a turn in ``current`` (``None``: not stored) may move to ``status``."""
    return status in MOVES[current]


def session_status_after(current: TurnStatus | None, status: TurnStatus) -> SessionStatus | None:
    """The session's status once one of its turns moves from ``current`` to
    ``status``; ``None`` leaves it as it is. A turn that is only queued, or settled
    without ever running, does not change what the session is doing."""
    if status == "queued" or (current == "queued" and status in TERMINAL):
        return None
    if status in TERMINAL:
        return "idle"
    return "suspended" if status == "suspended" else "running"


def first_cancel_reason(recorded: str | None, asked: str) -> str:
    """The cancellation reason that counts: the first one recorded."""
    return recorded if recorded is not None else asked


def new_turn(record: TurnRecord, *, owner: str | None = None) -> PutTurn:
    """Store ``record`` (``queued`` or ``running``) as a new turn; its session is
    created, ``owner``'s, if this is its first turn."""
    if not may_follow(None, record.status):
        raise TurnMoveError(
            f"turn {record.turn_id}: a new turn starts queued or running, not {record.status}"
        )
    fresh = replaced(
        record, finished_at=None, pending=None, cancel_reason=None, held_by=None, wake_at=None
    )
    return PutTurn(fresh, None, session_status_after(None, record.status), owner)


def wake_time(pending: SuspendCheckpoint | None) -> float | None:
    """When a turn parked on ``pending`` next needs the clock: the earliest deadline
    or reminder of its open requests."""
    if pending is None:
        return None
    times = [t for r in pending.requests for t in (r.expires_at, r.remind_at) if t is not None]
    return min(times) if times else None


def move(
    record: TurnRecord,
    status: TurnStatus,
    *,
    text: str | None = None,
    error: str | None = None,
    pending: SuspendCheckpoint | None = None,
    now: float | None = None,
    version: str | None = None,
    held_by: str | None = None,
) -> PutTurn:
    """Move the stored ``record`` to ``status``: the write that does it, planned
    from ``record.status`` (the store refuses it if the turn moved since).

    ``text``, ``error`` and ``pending`` replace the old ones (a suspend checkpoint
    is kept only by a ``suspended`` turn); a final status stamps ``finished_at``.
    ``version`` (if given) is the version the turn runs under from now on;
    ``held_by`` holds a ``suspended`` turn for that version (any move clears it).
    Raises ``TurnMoveError`` for a move ``MOVES`` does not allow."""
    current = record.status
    if not may_follow(current, status):
        raise TurnMoveError(
            f"session {record.session_id}: turn {record.turn_id} cannot move from "
            f"{current} to {status}"
        )
    kept = pending if status == "suspended" else None
    moved = replaced(
        record,
        status=status,
        text=text,
        error=error,
        pending=kept,
        finished_at=(time.time() if now is None else now) if status in TERMINAL else None,
        version=record.version if version is None else version,
        held_by=held_by if status == "suspended" else None,
        wake_at=wake_time(kept),
    )
    return PutTurn(moved, current, session_status_after(current, status))


def restamp(record: TurnRecord, version: str) -> PutTurn:
    """Record that the ``running`` turn ``record`` runs under ``version`` from now on
    (a delivery of another version took it over), its status unchanged: planned
    like a move, so the store refuses it if the turn moved since."""
    if record.status != "running":
        raise TurnMoveError(
            f"session {record.session_id}: turn {record.turn_id} is {record.status}; only "
            "a running turn changes version in place"
        )
    return PutTurn(replaced(record, version=version), "running", None)
