"""The ``WorkerView`` seam: what a shared store tells an operator about its workers.

A store that many worker processes share (``PostgresStore``) knows which workers
are alive (they register as they claim), which process holds each running turn's
session (its writer lock), and which process wrote each logged event. The operator
console reads these through this protocol where the store offers it; on a store
without it (SQLite, memory: one process runs the turns) it says so instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class LiveWorker:
    """A worker that said it is alive within the store's liveness window.

    ``holder`` is its store's name for the process (``host:pid:id``); ``agents``
    the version it runs of each agent; ``serves`` the turn versions it takes
    (``None``: all); ``seen_at`` when it last said so (seconds since the epoch, on
    the store's clock)."""

    holder: str
    agents: Mapping[str, str]
    serves: tuple[str, ...] | None
    seen_at: float


@dataclass(frozen=True)
class HeldSession:
    """A running turn and the process that last took its session's writer lock
    (``holder``, ``None`` if none ever did) at ``since``."""

    session_id: str
    turn_id: str
    agent: str
    tenant: str
    holder: str | None
    since: float | None


@runtime_checkable
class WorkerView(Protocol):
    """A store shared by workers that can say who is alive and who wrote what."""

    async def live_workers(self) -> list[LiveWorker]:
        """The workers alive now, by ``holder``."""
        ...

    async def held_sessions(self, *, limit: int) -> list[HeldSession]:
        """At most ``limit`` running turns, oldest first, each with its session's
        writer (a holder that is no live worker's left it: it waits for a takeover)."""
        ...

    async def event_writers(self, session_id: str) -> dict[int, str]:
        """``{seq: holder}`` for the logged events of ``session_id``'s live
        generation whose writing process is known (events logged before the store
        recorded it are left out)."""
        ...
