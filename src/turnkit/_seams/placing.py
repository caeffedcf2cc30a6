"""The ``PlacingStore`` seam: a store that keeps each session where its tenant lives.

A store spread over several databases (``turnkit.stores.postgres.Cells``) has to
know a new session's tenant before the session's first row is written, and every
``Store`` call names a session only. So before a session stores or opens a turn,
the runtime tells such a store whose turn it is; a store that keeps every session in
one place does not offer this, and the runtime skips the call.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class PlacingStore(Protocol):
    """A ``Store`` that places sessions by tenant (docs/deploying.md, "Cells")."""

    async def place(self, session_id: str, tenant: str) -> None:
        """``session_id`` is about to store or run a turn of ``tenant``: a session the
        store has not placed yet goes where ``tenant`` lives; one already placed
        stays where it is (so a session lives in one place, whatever tenants its
        later turns name)."""
        ...
