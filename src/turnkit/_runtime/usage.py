"""Reading token usage back from the store: a turn's, and a session's total.

Usage lives on each model step's stored record (see ``turnkit._values.usage``), so
these sums are read from the store and agree in every process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._seams.store import NO_MESSAGES, SessionStore, transcript
from .._values.messages import Message
from .._values.usage import Usage, steps_usage


async def turn_usage(store: SessionStore, turn_id: str) -> Usage:
    """What the stored model calls of ``turn_id`` used (its steps, read without the
    transcript)."""
    snapshot = await store.load(turn_id, from_index=NO_MESSAGES)
    return steps_usage(snapshot.steps)


async def session_usage(store: SessionStore, messages: Sequence[Message] | None = None) -> Usage:
    """What every turn of the live generation used: one read of steps per turn in
    ``messages`` (the transcript, read here when not given)."""
    if messages is None:
        messages = await transcript(store)
    result = Usage()
    for turn_id in _turn_ids(messages):
        result = result + await turn_usage(store, turn_id)
    return result


def _turn_ids(messages: Iterable[Message]) -> list[str]:
    return list(dict.fromkeys(m.turn_id for m in messages))
