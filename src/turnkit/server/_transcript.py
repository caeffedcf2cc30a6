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
from .._values.messages import Message
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
        "turns": await _turns(store, snapshot.messages),
    }
    if events is not None:
        body["events"] = events
    return body


async def _turns(store: SessionStore, messages: list[Message]) -> list[dict[str, Any]]:
    """The session's latest turn and its unfinished ones: status, the agent version
    each runs under, and the version holding it, if one does (docs/deploying.md)."""
    records = {r.turn_id: r for r in await store.unfinished()}
    latest = messages[-1].turn_id if messages else None
    if latest is not None and latest not in records:
        record = await store.turn(latest)
        if record is not None:
            records[latest] = record
    ordered = sorted(records.values(), key=lambda r: r.created_at)
    return [
        {
            "turn_id": r.turn_id,
            "status": r.status,
            "version": r.version,
            "held_by": r.held_by,
            "error": r.error if r.held_by is not None else None,
        }
        for r in ordered
    ]


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
