"""What ``GET …/transcript`` answers: the live generation, with its event log when
asked (the chat page draws a session's history from it) and the tokens its turns
used, or an archived generation.

Archived generations keep their transcript only: the store's seam reads no archived
events, so an archived answer has no ``events``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._runtime.usage import session_usage
from .._seams.store import SessionStore
from ._bodies import HttpError, flag, non_negative_int


async def transcript_body(store: SessionStore, query: Mapping[str, str]) -> dict[str, Any]:
    """The JSON body for ``query``'s ``generation`` (absent: the live one) and
    ``events`` (``true``: add the live generation's logged events, in order)."""
    with_events = flag(query.get("events"), "events")
    raw = query.get("generation")
    if raw is not None:
        return await _archived(store, non_negative_int(raw, "generation", default=0))
    # The log is read first: every event it holds is for a message the transcript,
    # read after it, holds too.
    events = [e.to_dict() for e in await store.events()] if with_events else None
    snapshot = await store.load()
    body: dict[str, Any] = {
        "status": await store.status(),
        "generation": snapshot.generation,
        # The last logged event: where a client's feed picks up from.
        "last_seq": snapshot.next_seq - 1,
        "messages": [m.to_dict() for m in snapshot.messages],
        "generations": await store.generations(),
        # What every turn's model calls used (each assistant message has its own).
        "usage": (await session_usage(store, snapshot.messages)).to_dict(),
    }
    if events is not None:
        body["events"] = events
    return body


async def _archived(store: SessionStore, generation: int) -> dict[str, Any]:
    archived = await store.generations()
    if generation not in archived:
        have = ", ".join(str(g) for g in archived) or "none"
        raise HttpError(
            404,
            "unknown_generation",
            f"session {store.session_id!r} has no archived generation {generation} "
            f"(archived: {have})",
        )
    messages = await store.archived_messages(generation)
    return {
        "status": "archived",
        "generation": generation,
        "messages": [m.to_dict() for m in messages],
    }
