"""The ``TurnQueue`` seam: a store whose submitted turns workers in any process claim.

A store that many processes share (``PostgresStore``) offers it beside ``Store``.
``turnkit.Worker`` claims runnable sessions from it and delivers their turns; the
claim hands each session's writer lock to the delivery that holds its ``writer()``
next, so a session is one worker's at a time. See ``docs/stores.md``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .._values.records import TurnRecord
from .._values.tenancy import UNCAPPED, Concurrency


@dataclass(frozen=True)
class PendingReset:
    """A claimed session whose next work is a reset that was recorded and not carried
    out (a ``RequestReset`` write; the process that asked for it may have died):
    the claimer archives the generation, then the turns stored after it can run."""

    session_id: str
    agent: str


@dataclass(frozen=True)
class Serving:
    """Which turns a claim takes by agent version (docs/deploying.md).

    ``own`` is the version the claimer runs of each of its agents; ``serves`` the
    turn versions it takes (``None``: every version; a turn recorded without a
    version is always taken). With ``retry_held``, the claim also takes turns held
    by a version other than the claimer's own, to try them again."""

    own: Mapping[str, str] = field(default_factory=dict)
    serves: frozenset[str] | None = None
    retry_held: bool = False


@runtime_checkable
class WorkerRegistry(Protocol):
    """A shared store that keeps which workers are alive and what they serve, so a
    scrape can tell the turns no live worker would take."""

    async def worker_seen(self, own: Mapping[str, str], serves: Collection[str] | None) -> None:
        """Record this process as a live worker running ``own`` and serving ``serves``."""
        ...

    async def worker_gone(self) -> None:
        """Remove this process from the live workers (it stopped)."""
        ...

    async def unserved_turns(self) -> list[tuple[str, str, int]]:
        """``(agent, version, how many)`` of the unfinished turns no live worker
        serves (turns without a version are every worker's)."""
        ...


@runtime_checkable
class TurnQueue(Protocol):
    """What ``Worker`` needs of the store beside ``Store``."""

    async def claim(
        self,
        agents: Sequence[str],
        *,
        limit: int,
        skip: Collection[str] = (),
        serving: Serving | None = None,
        concurrency: Concurrency = UNCAPPED,
    ) -> list[TurnRecord | PendingReset]:
        """Claim at most ``limit`` sessions of ``agents`` that no process holds (and
        not in ``skip``), oldest runnable turn first, and return each one's runnable
        turn: its oldest turn that is queued, running (a dead process left it so) or
        parked with a cancellation recorded. While a reset is pending on a session,
        only what the reset cancelled is runnable; once none is left, the session is
        returned as a ``PendingReset``. ``serving`` narrows the claim to the turn
        versions it serves, and may take held turns to try again (see ``Serving``;
        ``None``: every version, no held turn). Each session returned is this process's
        until the next ``writer()`` of it ends (or ``unclaim``); two claims anywhere
        never return one session at once. Claims are fair across tenants (the
        tenants with the fewest sessions running go first), and a tenant never runs
        more sessions at once, across every claimer, than ``concurrency`` caps it
        to (see docs/tenants.md)."""
        ...

    def unclaim(self, session_id: str) -> None:
        """Give back a claimed session whose delivery never held its ``writer()``."""
        ...

    async def wait_for_turns(self, timeout: float) -> None:
        """Return once a turn may have become runnable since the last ``claim`` (a
        submission, a resume, a cancellation anywhere), or after ``timeout`` seconds."""
        ...
