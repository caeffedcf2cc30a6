"""The ``PrunableStore`` seam: what a store offers so retention can find what aged out.

Retention (``turnkit.Retention``) deletes through ordinary commits (``DropGeneration``
and ``PruneSession`` writes, one session at a time); all it needs of the store
besides is to list candidates oldest first, from an index, a page at a time. Every
built-in store has both reads.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class PrunableStore(Protocol):
    """A ``Store`` whose aged-out sessions and archives can be listed page by page."""

    async def idle_sessions(
        self, before: float, *, limit: int, after: tuple[float, str] | None = None
    ) -> list[tuple[float, str]]:
        """Up to ``limit`` sessions as ``(updated_at, session_id)``, oldest first and
        after the key ``after``: those last updated before ``before`` (seconds since
        the epoch) with no turn queued, running or parked and no reset pending."""
        ...

    async def old_generations(
        self, before: float, *, limit: int, after: tuple[float, str, int] | None = None
    ) -> list[tuple[float, str, int]]:
        """Up to ``limit`` archived generations as ``(archived_at, session_id,
        generation)``, oldest first and after the key ``after``: those archived
        before ``before``."""
        ...

    async def ended_turns(
        self, before: float, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[tuple[float, str, str]]:
        """Up to ``limit`` turns of live generations as ``(finished_at, session_id,
        turn_id)``, oldest first and after the key ``after``: those that ended before
        ``before`` and whose events were not trimmed yet (``TrimEvents``)."""
        ...
