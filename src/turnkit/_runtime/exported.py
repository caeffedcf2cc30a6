"""A session as a file: the versioned JSON form ``turnkit export`` writes and
``turnkit import`` (and ``turnkit.testing.replay``) reads.

The form is the stores' own JSON for each value (``Message.to_dict()``, the events'
``to_dict()``, each step's memoized result as stored) inside one object; see
``docs/fork-and-replay.md`` for the fields. Reading checks every field and names
the first one that is wrong (``turns[2].record.status: …``), so a hand-edited or
truncated file is refused before anything is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast, get_args

from .._errors import ConfigurationError, MessageDecodeError, SessionFileError
from .._seams.placing import PlacingStore
from .._seams.store import NO_MESSAGES, Store
from .._values.checkpoints import SuspendCheckpoint
from .._values.events import event_from_dict
from .._values.inbound import InboundEvent
from .._values.messages import JsonObject, message_from_dict, opening_from_dict
from .._values.records import TurnRecord, TurnStatus
from .._values.tenancy import DEFAULT_TENANT
from .._values.times import rfc3339
from .._values.writes import ArchiveGeneration, Write
from .forking import fork_point, plan_copy
from .recorded import RecordedSession, RecordedTurn, read_recorded

#: What the ``format`` field of every exported session says.
FORMAT = "turnkit.session"
#: The newest version of the form this turnkit writes and reads.
VERSION = 1

_V = TypeVar("_V")
_STATUSES = frozenset(get_args(TurnStatus))
_RECORD_TEXTS = ("text", "error", "cancel_reason", "version", "held_by", "tenant")
_RECORD_OBJECTS = ("opening", "event", "pending")


async def export_session(
    store: Store, session_id: str, generation: int | None = None
) -> JsonObject:
    """The live generation of ``session_id`` (or archived ``generation``) as the
    versioned JSON object ``import_session`` reads back."""
    recorded = await read_recorded(store.session(session_id), generation)
    return recorded_to_json(recorded)


def recorded_to_json(recorded: RecordedSession) -> JsonObject:
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": rfc3339(time.time()),
        "session_id": recorded.session_id,
        "generation": recorded.generation,
        "agent": recorded.agent,
        "owner": recorded.owner,
        "messages": [m.to_dict() for m in recorded.messages],
        "turns": [
            {
                "turn_id": t.turn_id,
                "record": None if t.record is None else _record_json(t.record),
                "steps": t.steps,
            }
            for t in recorded.turns
        ],
        "events": [e.to_dict() for e in recorded.events],
    }


def _record_json(record: TurnRecord) -> JsonObject:
    return {
        "status": record.status,
        "agent": record.agent,
        "opening": record.opening.to_dict(),
        "event": record.event.to_dict() if record.event is not None else None,
        "text": record.text,
        "error": record.error,
        "created_at": record.created_at,
        "finished_at": record.finished_at,
        "pending": record.pending.to_dict() if record.pending is not None else None,
        "cancel_reason": record.cancel_reason,
        "version": record.version,
        "held_by": record.held_by,
        "tenant": record.tenant,
    }


def recorded_from_json(data: object) -> RecordedSession:
    """Read an exported session; ``SessionFileError`` naming the first wrong field."""
    root = _object(data, "the file")
    if root.get("format") != FORMAT:
        raise SessionFileError(f"format: expected {FORMAT!r}, got {root.get('format')!r}")
    version = root.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SessionFileError(f"version: expected a whole number from 1, got {version!r}")
    if version > VERSION:
        raise SessionFileError(
            f"version: the file is version {version}; this turnkit reads up to {VERSION} "
            "(upgrade turnkit to import it)"
        )
    session_id = _text(root, "session_id", "session_id")
    generation = root.get("generation")
    if generation is not None and (not isinstance(generation, int) or isinstance(generation, bool)):
        raise SessionFileError(f"generation: expected a whole number or null, got {generation!r}")
    messages = []
    for i, raw in enumerate(_list(root, "messages")):
        try:
            messages.append(message_from_dict(raw))
        except (MessageDecodeError, ValueError, TypeError) as exc:
            raise SessionFileError(f"messages[{i}]: {exc}") from None
    turns = [_turn(raw, f"turns[{i}]", session_id) for i, raw in enumerate(_list(root, "turns"))]
    events = []
    for i, raw in enumerate(_list(root, "events")):
        try:
            events.append(event_from_dict(raw))
        except (MessageDecodeError, ValueError, TypeError, KeyError) as exc:
            raise SessionFileError(f"events[{i}]: {exc}") from None
    return RecordedSession(
        session_id=session_id,
        agent=_optional_text(root, "agent", "agent"),
        owner=_optional_text(root, "owner", "owner"),
        generation=generation,
        messages=messages,
        turns=turns,
        events=events,
    )


def _turn(raw: object, where: str, session_id: str) -> RecordedTurn:
    turn = _object(raw, where)
    turn_id = _text(turn, "turn_id", f"{where}.turn_id")
    steps = turn.get("steps", {})
    if not isinstance(steps, dict):
        raise SessionFileError(f"{where}.steps: expected an object, got {type(steps).__name__}")
    record_raw = turn.get("record")
    if record_raw is None:
        return RecordedTurn(turn_id=turn_id, record=None, steps=dict(steps))
    at = f"{where}.record"
    record = _object(record_raw, at)
    status = record.get("status")
    if status not in _STATUSES:
        raise SessionFileError(f"{at}.status: expected one of {sorted(_STATUSES)}, got {status!r}")
    for name in _RECORD_TEXTS:
        _optional_text(record, name, f"{at}.{name}")
    for name in _RECORD_OBJECTS:
        value = record.get(name)
        if value is not None and not isinstance(value, dict):
            raise SessionFileError(f"{at}.{name}: expected an object or null, got {value!r}")
    if not isinstance(record.get("opening"), dict):
        raise SessionFileError(f"{at}.opening: expected an object, got {record.get('opening')!r}")
    event, pending = record.get("event"), record.get("pending")
    times = {}
    for name in ("created_at", "finished_at"):
        value = record.get(name)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise SessionFileError(f"{at}.{name}: expected seconds or null, got {value!r}")
        times[name] = value
    return RecordedTurn(
        turn_id=turn_id,
        record=TurnRecord(
            session_id=session_id,
            turn_id=turn_id,
            agent=_text(record, "agent", f"{at}.agent"),
            status=cast(TurnStatus, status),
            opening=_decoded(opening_from_dict, record["opening"], f"{at}.opening", turn_id),
            event=None if event is None else _decoded(InboundEvent.from_dict, event, f"{at}.event"),
            text=record.get("text"),
            error=record.get("error"),
            created_at=float(times["created_at"] or 0.0),
            finished_at=times["finished_at"],
            pending=None
            if pending is None
            else _decoded(SuspendCheckpoint.from_dict, pending, f"{at}.pending"),
            cancel_reason=record.get("cancel_reason"),
            version=record.get("version"),
            held_by=record.get("held_by"),
            tenant=record.get("tenant") or "",
        ),
        steps=dict(steps),
    )


def _decoded(decode: Callable[..., _V], value: object, where: str, *args: Any) -> _V:
    """``value`` decoded by ``decode``; ``SessionFileError`` naming ``where`` if it is
    malformed."""
    try:
        return decode(value, *args)
    except (MessageDecodeError, ValueError, TypeError) as exc:
        raise SessionFileError(f"{where}: {exc}") from None


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SessionFileError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _list(root: dict[str, Any], name: str) -> list[Any]:
    value = root.get(name)
    if not isinstance(value, list):
        raise SessionFileError(f"{name}: expected a list, got {type(value).__name__}")
    return value


def _text(data: dict[str, Any], name: str, where: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        raise SessionFileError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _optional_text(data: dict[str, Any], name: str, where: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise SessionFileError(f"{where}: expected a string or null, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class ImportResult:
    """What an import stored: the session, how many messages, turns, steps and
    events, and the generation it archived to make room (``replace=True``)."""

    session_id: str
    messages: int
    turns: int
    steps: int
    events: int
    archived_generation: int | None = None


async def import_session(
    store: Store, data: object, *, session_id: str | None = None, replace: bool = False
) -> ImportResult:
    """Store an exported session as ``session_id`` (default: the id in the file).

    An existing session is refused, unless ``replace``: then its live generation
    is archived (as a reset does; nothing is lost) and the import becomes the live
    one, in one commit. A session with a turn still queued, running or parked is
    never replaced. ``SessionFileError`` names the first wrong field of ``data``.
    """
    recorded = recorded_from_json(data)
    if not recorded.messages:
        raise SessionFileError("messages: the file holds no message, so nothing to import")
    agent = recorded.agent or next((t.record.agent for t in recorded.turns if t.record), None)
    if agent is None:
        raise SessionFileError("agent: the file names no agent for the session")
    target_id = session_id or recorded.session_id
    if isinstance(store, PlacingStore):  # cells: where the session's tenant lives
        tenant = next((t.record.tenant for t in recorded.turns if t.record), DEFAULT_TENANT)
        await store.place(target_id, tenant)
    target = store.session(target_id)
    async with target.writer():
        snap = await target.load(from_index=NO_MESSAGES)
        exists = snap.agent is not None or snap.erased is not None
        prefix: list[Write] = []
        archived: int | None = None
        if exists and not replace:
            raise ConfigurationError(
                f"session {target_id!r} already exists; import it under another id, or "
                "replace it (its live generation is archived first)"
            )
        if exists:
            busy = await target.unfinished()
            if busy:
                raise ConfigurationError(
                    f"session {target_id!r} has turn {busy[0].turn_id} {busy[0].status}; "
                    "it cannot be replaced until that ends"
                )
            if await target.status() != "new":
                archived = snap.generation
                prefix.append(ArchiveGeneration(snap.generation, snap.agent or agent))
        writes, made = plan_copy(
            recorded,
            fork_point(recorded.messages, None),
            target_id,
            agent,
            first_seq=snap.next_seq,
            queued=True,
        )
        await target.commit([*prefix, *writes])
    return ImportResult(
        session_id=target_id,
        messages=made.at,
        turns=made.turns,
        steps=made.steps,
        events=made.events,
        archived_generation=archived,
    )
