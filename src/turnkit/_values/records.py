"""What the stores keep about turns and sessions, as plain values.

The statuses, ``TurnRecord``, ``SessionInfo`` and the ``SessionSnapshot`` a delivery
loads; the ``SessionStore`` seam hands these out and takes them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from .checkpoints import SuspendCheckpoint
from .frozen import quick_init
from .inbound import InboundEvent
from .messages import Message, OpeningMessage
from .step_results import StepResults
from .text import clean_fields

TurnStatus: TypeAlias = Literal[
    "queued", "running", "suspended", "completed", "failed", "cancelled"
]
SessionStatus: TypeAlias = Literal["new", "running", "suspended", "idle"]
TERMINAL_TURN_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


@quick_init
@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    """A turn as the store knows it, its payloads decoded by the store that read it:
    the opening message, the inbound event it came with, and a parked turn's
    suspend checkpoint (``pending``)."""

    session_id: str
    turn_id: str
    agent: str
    status: TurnStatus
    opening: OpeningMessage
    event: InboundEvent | None = None
    text: str | None = None
    error: str | None = None
    created_at: float = 0.0
    finished_at: float | None = None
    #: The suspend checkpoint of a ``suspended`` turn: what it waits for (see ``_park``).
    pending: SuspendCheckpoint | None = None
    #: Set once a cancellation was asked for (``requested``, ``replaced``, ``reset``);
    #: the turn ends ``cancelled`` at its next checkpoint boundary.
    cancel_reason: str | None = None
    #: The agent version the turn runs under (``Agent.turn_version``): recorded when it
    #: is queued or opens, changed only when a delivery of another version takes it
    #: on (see docs/deploying.md). ``None``: stored before turns recorded versions.
    version: str | None = None
    #: Set while the turn is held: parked because the agent versions named here
    #: (comma-separated, in the order they refused) would not run it; ``error``
    #: says why. Only a delivery of a version not among them tries it again.
    held_by: str | None = None
    #: When a ``suspended`` turn has something for the clock to do (a deadline, a
    #: reminder, the end of a sleep or of a retry's backoff), seconds since the epoch;
    #: ``None`` otherwise. Set by ``turn_rules.move`` from ``pending``.
    wake_at: float | None = None
    #: Whose turn this is, for fair claims, concurrency caps and budgets (see
    #: docs/tenants.md): set when the turn is stored and never changed. ``""`` is the
    #: default tenant, shared by every turn nobody gave one.
    tenant: str = ""

    def __post_init__(self) -> None:
        clean_fields(self, ("text", "error", "cancel_reason"))


def refused_by(record: TurnRecord, version: str) -> bool:
    """Whether agent version ``version`` is among those holding ``record``."""
    held = record.held_by
    return held is not None and version in held.split(",")


#: Longest ``SessionInfo.preview``, in characters.
PREVIEW_CHARS = 80
#: How much of the first message's text a store reads to make a preview: enough to
#: fold runs of whitespace and still fill one.
PREVIEW_READ_CHARS = 4 * PREVIEW_CHARS


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    """One row of ``runtime.sessions()``. ``preview`` is the start of the live
    generation's first message (see ``preview_of``); ``None`` while it has none."""

    session_id: str
    agent: str
    status: SessionStatus
    updated_at: float
    preview: str | None = None
    #: Who opened the session (a principal's id, see ``AgentSession.start``);
    #: ``None`` for a session opened from code or before owners were recorded.
    owner: str | None = None


def preview_of(text: object) -> str | None:
    """A session's preview from the text of its first message: whitespace folded to
    single spaces, cut to ``PREVIEW_CHARS`` (a cut one ends in ``…``)."""
    if not isinstance(text, str):
        return None
    folded = " ".join(text.split())
    if len(folded) <= PREVIEW_CHARS:
        return folded
    return folded[: PREVIEW_CHARS - 1] + "…"


#: Where a page of sessions ends: the last row's ``(updated_at, session_id)``.
SessionKey = tuple[float, str]


def newest_first(
    infos: list[SessionInfo],
    *,
    agent: str | None,
    limit: int,
    after: SessionKey | None,
    owner: str | None = None,
) -> list[SessionInfo]:
    """``session_page`` over rows already in memory (the in-memory store's way)."""
    rows = [
        i
        for i in infos
        if (agent is None or i.agent == agent) and (owner is None or i.owner == owner)
    ]
    rows.sort(key=lambda i: (-i.updated_at, i.session_id))
    if after is not None:
        rows = [i for i in rows if (-i.updated_at, i.session_id) > (-after[0], after[1])]
    return rows[:limit]


@dataclass(frozen=True)
class Erasure:
    """What is left of an erased session's contents: who erased it (``None``: code
    with no principal) and when (the store's clock, seconds since the epoch)."""

    by: str | None
    at: float


@dataclass(frozen=True, kw_only=True)
class SessionSnapshot:
    """What a turn needs to start or resume, read in one go.

    ``steps`` holds only the given turn's memoized results, so a replay never reads
    the whole step history; ``next_seq`` is the next event sequence number.
    ``messages`` starts at transcript position ``from_index`` (what was asked for).
    """

    messages: list[Message]
    #: The store's identity: made once when the store was created, kept durably and
    #: the same for every session, process and reopening of it (see ``Store``).
    store_id: str
    steps: StepResults = field(default_factory=StepResults)
    turn: TurnRecord | None = None
    agent: str | None = None
    next_seq: int = 1
    #: How many times the session was reset: its live history is generation ``generation``.
    generation: int = 0
    from_index: int = 0
    #: Who opened the session (``None``: nobody in particular, or no session yet).
    owner: str | None = None
    #: Whether a reset was requested and not carried out yet (``request_reset``): the
    #: process holding the writer lock archives before it runs a turn stored after it.
    reset_requested: bool = False
    #: The session's tombstone, once it was erased (``EraseSession``): who and when.
    erased: Erasure | None = None
