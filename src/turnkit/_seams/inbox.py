"""The ``InboxStore`` seam: what a store offers so the inbox can find every parked
turn across sessions and agents, oldest first, from an index, a page at a time.

``runtime.pending_inputs`` (and ``GET /inbox``) walk these pages and keep the
questions a caller may answer. Every built-in store implements it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._values.records import TurnRecord

#: A parked turn's place in the walk: ``(created_at, session_id, turn_id)``.
ParkedKey = tuple[float, str, str]


@runtime_checkable
class InboxStore(Protocol):
    """A ``Store`` whose parked turns can be listed page by page."""

    async def parked_turns(self, *, limit: int, after: ParkedKey | None = None) -> list[TurnRecord]:
        """Up to ``limit`` turns of live generations that are ``suspended``, ordered
        by ``(created_at, session_id, turn_id)`` and after the key ``after``, each
        with its suspend checkpoint (``pending``)."""
        ...
