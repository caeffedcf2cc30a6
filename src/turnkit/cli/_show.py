"""What ``turnkit sessions`` and ``turnkit show`` read from a store.

Everything goes through the ``Store``/``SessionStore`` seam, so the commands work on
every backend. A session's memoized steps are read one turn at a time with
``load(turn_id, from_index=<end of transcript>)``, which returns that turn's steps
and record without reading the transcript again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .._seams.store import SessionStore, Store, all_sessions, parked_turn, transcript
from .._values.events import InputAnsweredEvent
from .._values.inputs import InputRequest
from .._values.messages import JsonObject, Message
from .._values.records import SessionInfo, TurnRecord
from .._values.times import rfc3339
from .._values.usage import Usage, steps_usage
from ._progress import Progress
from ._store import CliError

_GENERATION = re.compile(r"^(?P<session>.+)#g(?P<n>\d+)$")


@dataclass(frozen=True, kw_only=True)
class TurnView:
    """One turn of the live generation: its record, memoized steps and the answers
    its questions got (its logged ``input.answered`` events)."""

    turn_id: str
    record: TurnRecord | None
    steps: dict[str, Any] = field(default_factory=dict)
    answers: list[InputAnsweredEvent] = field(default_factory=list)

    @property
    def usage(self) -> Usage:
        """What the turn's stored model calls used."""
        return steps_usage(self.steps)


@dataclass(frozen=True, kw_only=True)
class SessionView:
    """Everything ``turnkit show SESSION`` prints about the live generation."""

    session_id: str
    agent: str | None
    status: str
    generation: int
    messages: list[Message]
    turns: list[TurnView]
    parked: TurnRecord | None
    generations: list[int]
    #: On PostgreSQL: the process that last took the session's writer lock (after a
    #: takeover, the worker that took it over) and since when.
    writer: tuple[str, float] | None = None
    #: Whose the session is (the principal its first turn was opened for), if anyone's.
    owner: str | None = None

    @property
    def request(self) -> InputRequest | None:
        """The parked turn's pending request (the first still open), if it is parked."""
        return parked_request(self.parked)

    @property
    def requests(self) -> tuple[InputRequest, ...]:
        """Every request the parked turn waits on (none if the session is not parked)."""
        return parked_requests(self.parked)

    @property
    def usage(self) -> Usage:
        """What every turn of the live generation used."""
        result = Usage()
        for turn in self.turns:
            result = result + turn.usage
        return result


@dataclass(frozen=True, kw_only=True)
class ArchiveView:
    """``turnkit show SESSION#gN``: the transcript of an archived generation."""

    session_id: str
    generation: int
    messages: list[Message]


def split_target(target: str) -> tuple[str, int | None]:
    """``"s1#g2"`` → ``("s1", 2)``; a plain session id → ``(id, None)``."""
    found = _GENERATION.match(target)
    if found is None:
        return target, None
    return found.group("session"), int(found.group("n"))


def utc(timestamp: float | None) -> str:
    """A stored time (seconds since the epoch) as a readable UTC time."""
    if not timestamp:
        return "-"
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


async def list_sessions(
    store: Store, *, agent: str | None, limit: int | None, progress: Progress
) -> list[SessionInfo]:
    """The store's sessions, newest first, optionally of one agent only."""
    progress.update("reading the session list…", force=True)
    if limit is not None:  # the newest few, read by key from the store's index
        return await store.session_page(agent=agent, limit=limit)
    found = [s for s in await all_sessions(store) if agent is None or s.agent == agent]
    found.sort(key=lambda s: (-s.updated_at, s.session_id))
    return found


async def read_session(
    store: Store, session_id: str, progress: Progress, *, where: str
) -> SessionView:
    """The live generation of ``session_id``; ``CliError`` naming it and the store
    (``where``) if there is no such session."""
    session = store.session(session_id)
    progress.update(f"reading session {session_id}…", force=True)
    snapshot = await session.load()
    status = await session.status()
    generations = await session.generations()
    if status == "new" and not snapshot.messages and not generations:
        raise CliError(f"session {session_id!r} does not exist in {where}")
    turns = await _read_turns(session, snapshot.messages, progress)
    turns = await _with_answers(session, turns)
    return SessionView(
        session_id=session_id,
        agent=snapshot.agent,
        status=status,
        generation=snapshot.generation,
        messages=snapshot.messages,
        turns=turns,
        parked=await parked_turn(session),
        generations=generations,
        writer=await _writer_of(store, session_id),
        owner=snapshot.owner,
    )


async def _writer_of(store: Store, session_id: str) -> tuple[str, float] | None:
    """Who last ran the session, where the store records it (``PostgresStore``)."""
    writer_of = getattr(store, "writer_of", None)
    if writer_of is None:
        return None
    found = await writer_of(session_id)
    return (found.holder, found.since) if found is not None else None


async def _read_turns(
    session: SessionStore, messages: Sequence[Message], progress: Progress
) -> list[TurnView]:
    """Each turn of the transcript, in order of first appearance, with its steps."""
    turn_ids = list(dict.fromkeys(m.turn_id for m in messages))
    end = len(messages)
    turns: list[TurnView] = []
    for n, turn_id in enumerate(turn_ids, start=1):
        progress.update(f"reading {end:,} messages: steps of turn {n:,} of {len(turn_ids):,}…")
        snapshot = await session.load(turn_id, from_index=end)
        record = snapshot.turn if snapshot.turn is not None else await session.turn(turn_id)
        turns.append(TurnView(turn_id=turn_id, record=record, steps=dict(snapshot.steps.items())))
    return turns


async def _with_answers(session: SessionStore, turns: list[TurnView]) -> list[TurnView]:
    """``turns`` with the answers the session's event log records for each."""
    answers: dict[str, list[InputAnsweredEvent]] = {}
    for event in await session.events():
        if isinstance(event, InputAnsweredEvent):
            answers.setdefault(event.turn_id, []).append(event)
    return [
        TurnView(turn_id=t.turn_id, record=t.record, steps=t.steps, answers=answers[t.turn_id])
        if t.turn_id in answers
        else t
        for t in turns
    ]


async def read_archive(
    store: Store, session_id: str, generation: int, progress: Progress, *, where: str
) -> ArchiveView:
    """Archived generation ``generation`` of ``session_id``; ``CliError`` naming what is
    missing (the session, or that generation of it)."""
    session = store.session(session_id)
    progress.update(f"reading {session_id}#g{generation}…", force=True)
    generations = await session.generations()
    if generation not in generations:
        status = await session.status()
        if not generations and status == "new" and not await transcript(session):
            raise CliError(f"session {session_id!r} does not exist in {where}")
        have = ", ".join(f"g{n}" for n in generations) or "none"
        raise CliError(
            f"session {session_id!r} has no archived generation {generation} "
            f"(archived generations: {have})"
        )
    messages = await session.archived_messages(generation)
    return ArchiveView(session_id=session_id, generation=generation, messages=messages)


def parked_request(record: TurnRecord | None) -> InputRequest | None:
    """The request in a suspended turn's checkpoint (``None`` if there is none)."""
    requests = parked_requests(record)
    return requests[0] if requests else None


def parked_requests(record: TurnRecord | None) -> tuple[InputRequest, ...]:
    """The requests still open in a suspended turn's checkpoint, in call order."""
    if record is None or record.pending is None:
        return ()
    return record.pending.requests


def session_json(view: SessionView, store: str) -> JsonObject:
    """``turnkit show --json``: the live generation, in the stores' own JSON forms."""
    request = view.request
    return {
        "session_id": view.session_id,
        "store": store,
        "agent": view.agent,
        "owner": view.owner,
        "status": view.status,
        "generation": view.generation,
        "messages": [{"index": i, **m.to_dict()} for i, m in enumerate(view.messages)],
        "turns": [_turn_json(t) for t in view.turns],
        "parked": None if request is None else request.to_dict(),
        "parked_requests": [r.to_dict() for r in view.requests],
        "generations": view.generations,
        "usage": view.usage.to_dict(),
        "writer": None
        if view.writer is None
        else {"holder": view.writer[0], "since": rfc3339(view.writer[1])},
    }


def _turn_json(turn: TurnView) -> JsonObject:
    record = turn.record
    return {
        "turn_id": turn.turn_id,
        "status": record.status if record else None,
        "created_at": rfc3339(record.created_at or None) if record else None,
        "finished_at": rfc3339(record.finished_at or None) if record else None,
        "text": record.text if record else None,
        "error": record.error if record else None,
        "cancel_reason": record.cancel_reason if record else None,
        "version": record.version if record else None,
        "held_by": record.held_by if record else None,
        "steps": turn.steps,
        "usage": turn.usage.to_dict(),
        "answers": [
            {
                "input_id": a.input_id,
                "call_id": a.call_id,
                "tool": a.tool,
                "kind": a.kind,
                "by": a.by,
                "source": a.source,
                "value": a.value,
                "seq": a.seq,
                "at": rfc3339(a.at),
            }
            for a in turn.answers
        ],
    }


def archive_json(view: ArchiveView, store: str) -> JsonObject:
    """``turnkit show SESSION#gN --json``."""
    return {
        "session_id": view.session_id,
        "store": store,
        "generation": view.generation,
        "archived": True,
        "messages": [{"index": i, **m.to_dict()} for i, m in enumerate(view.messages)],
    }


def sessions_json(sessions: Sequence[SessionInfo]) -> list[JsonObject]:
    """``turnkit sessions --json``: one object per session, newest first."""
    return [
        {
            "session_id": s.session_id,
            "agent": s.agent,
            "status": s.status,
            "updated_at": rfc3339(s.updated_at),
        }
        for s in sessions
    ]
