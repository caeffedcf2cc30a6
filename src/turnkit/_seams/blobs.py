"""The ``BlobStore`` seam: where a store keeps payloads too large for its rows.

A store given a blob store keeps a message, step result or event whose JSON is over
its threshold as a reference in the row and the large part (a field of it, or all
of it) as a blob. A blob is named by its session, its turn and the SHA-256 of its
bytes, so the copies of one tool result (its step, its message and its event) share
one blob, and a blob is deleted with its turn's generation or its session.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable


@runtime_checkable
class BlobStore(Protocol):
    """Keeps blobs by ``(session_id, turn_id, name)``; names are hex SHA-256 digests.

    Called on the store's path, synchronously (from the event loop's thread and from
    tool threads), so ``put`` and ``get`` must be thread-safe and should be fast.
    ``put`` must make the blob durable before it returns: the row that refers to it
    commits right after. Putting a blob that exists already changes nothing.
    """

    def put(self, session_id: str, turn_id: str, name: str, data: bytes) -> None: ...

    def get(self, session_id: str, turn_id: str, name: str) -> bytes | None:
        """The blob, or ``None`` if there is none by that key."""
        ...

    def delete_turns(self, session_id: str, turn_ids: Iterable[str]) -> None:
        """Delete every blob of these turns of the session (missing ones are fine)."""
        ...

    def delete_session(self, session_id: str) -> None:
        """Delete every blob of the session (missing ones are fine)."""
        ...
