"""A session's generation read whole through the store seam: what fork, export and
replay start from.

Only the ``SessionStore`` seam's reads are used, so this works on every store: the
live transcript and events, and each turn's record and steps with
``load(turn_id, from_index=<end>)`` (which reads no message again). An archived
generation offers only its transcript through the seam, so its turns carry no
record, steps or events here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigurationError
from .._seams.store import NO_MESSAGES, SessionStore
from .._values.events import TurnEvent
from .._values.messages import Message
from .._values.records import TurnRecord


@dataclass(frozen=True, kw_only=True)
class RecordedTurn:
    """One turn as stored: its record (``None`` for an archived generation's turn,
    whose record the seam does not read) and its memoized steps by step id."""

    turn_id: str
    record: TurnRecord | None
    steps: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RecordedSession:
    """A generation of a session as the store holds it. ``turns`` are in the order
    their messages first appear in the transcript, then any unfinished turn with no
    message yet (a queued one); ``generation`` is ``None`` for the live one."""

    session_id: str
    agent: str | None
    owner: str | None
    generation: int | None
    messages: list[Message]
    turns: list[RecordedTurn]
    events: list[TurnEvent]

    @property
    def source(self) -> str:
        """How the generation is named: ``s1``, or ``s1#g0`` for an archived one."""
        if self.generation is None:
            return self.session_id
        return f"{self.session_id}#g{self.generation}"


async def read_recorded(store: SessionStore, generation: int | None = None) -> RecordedSession:
    """Read the live generation (``generation=None``) or an archived one of the
    session; ``ConfigurationError`` naming what is missing."""
    snap = await store.load(from_index=0)
    sid = store.session_id
    if generation is not None:
        have = await store.generations()
        if generation not in have:
            listed = ", ".join(f"g{n}" for n in have) or "none"
            raise ConfigurationError(
                f"session {sid!r} has no archived generation {generation} "
                f"(archived generations: {listed})"
            )
        messages = await store.archived_messages(generation)
        return RecordedSession(
            session_id=sid,
            agent=snap.agent,
            owner=snap.owner,
            generation=generation,
            messages=messages,
            turns=[RecordedTurn(turn_id=t, record=None) for t in _turn_order(messages)],
            events=[],
        )
    if snap.agent is None and not snap.messages:
        raise ConfigurationError(f"session {sid!r} does not exist in the store")
    messages = snap.messages
    order = _turn_order(messages)
    order += [r.turn_id for r in await store.unfinished() if r.turn_id not in order]
    turns: list[RecordedTurn] = []
    for turn_id in order:
        loaded = await store.load(turn_id, from_index=NO_MESSAGES)
        record = loaded.turn if loaded.turn is not None else await store.turn(turn_id)
        turns.append(RecordedTurn(turn_id=turn_id, record=record, steps=dict(loaded.steps.items())))
    return RecordedSession(
        session_id=sid,
        agent=snap.agent,
        owner=snap.owner,
        generation=None,
        messages=messages,
        turns=turns,
        events=await store.events(),
    )


def _turn_order(messages: list[Message]) -> list[str]:
    return list(dict.fromkeys(m.turn_id for m in messages))
