"""``MemoryStore``: sessions kept in process memory, for tests and throwaway demos.

It honours the seam's contract, commit and rollback included, except what memory
cannot give: there is no connection for tools (``ctx.store.unwrap()`` is
``None``), so exactly-once app writes need a SQL store. Everything is kept as encoded JSON, as a
durable store would keep it, so what passes here also survives a real store.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from pydantic_core import from_json

from .._errors import (
    ConfigurationError,
    GenerationArchivedError,
    StoreError,
    TurnMoveError,
    WriteConflictError,
)
from .._seams.blobs import BlobStore
from .._seams.codec import Codec, PayloadKind
from .._seams.store import NoHandle, ToolStep
from .._values.budgets import NO_SPEND, Spend
from .._values.events import TurnEvent, event_from_dict
from .._values.frozen import replaced
from .._values.messages import Message, message_from_dict
from .._values.records import (
    Erasure,
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    SessionStatus,
    TurnRecord,
    TurnStatus,
    newest_first,
    preview_of,
)
from .._values.step_results import StepResults
from .._values.turn_rules import UNFINISHED, first_cancel_reason
from .._values.writes import AppendMessage, CountUsage, LogEvent, PutStep, Write
from ._apply import apply_writes
from ._json import kept_json_bytes
from ._locks import SessionLocks
from ._off_loop import on_thread
from ._payloads import KeptTurn, Payloads
from ._spill import DEFAULT_BLOB_THRESHOLD, Seen
from ._tool_threads import ToolThreads
from ._usage_sql import session_bucket, tenant_bucket

T = TypeVar("T")

_NO_HANDLE = NoHandle("the in-memory store has no transactional handle; use SqliteStore")

#: The threads ``def`` tools run on, shared by every in-memory store of the process
#: (started as tools need them; at most as many as the loop's default executor has).
_TOOL_THREADS = ToolThreads(min(32, (os.cpu_count() or 1) + 4), "turnkit-memory-tool")


@dataclass
class _SessionData:
    agent: str | None = None
    status: SessionStatus = "new"
    updated_at: float = 0.0
    messages: list[bytes] = field(default_factory=list)
    #: Every step of the live generation, by step id (unique in the session) ...
    steps: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    #: ... and by turn, so ``load`` reads one turn's without walking the history.
    turn_steps: dict[str, dict[str, bytes]] = field(default_factory=dict)
    events: list[tuple[int, str, bytes]] = field(default_factory=list)
    #: Each turn with its payloads encoded (``Payloads.keep_turn``), by turn id.
    turns: dict[str, KeptTurn] = field(default_factory=dict)
    generation: int = 0
    #: Who opened the session (set once, when its first turn opened it).
    owner: str | None = None
    #: When a reset was requested, until it is carried out (``None``: none pending).
    reset_requested: float | None = None
    #: Retired generations: their transcripts (encoded, as live ones are kept).
    archive: dict[int, list[bytes]] = field(default_factory=dict)
    #: The last event number of the retired generations: numbering carries on after it.
    archived_seq: int = 0
    #: The tombstone an erasure leaves (``None``: never erased).
    erased: Erasure | None = None
    #: When each archived generation was retired (what retention ages them by).
    archived_at: dict[int, float] = field(default_factory=dict)
    #: Ended turns whose events retention has cut to their last one.
    trimmed: frozenset[str] = frozenset()
    #: The turns each archived generation retired (their blobs go with it).
    archived_turns: dict[int, frozenset[str]] = field(default_factory=dict)


def _json(value: Any, what: str, name: str) -> bytes:
    """``value`` as JSON, or the store's refusal naming ``what`` (and ``name``)."""
    try:
        return kept_json_bytes(value)
    except Exception as exc:
        raise StoreError(f"cannot store {what}{name} as JSON: {exc}") from exc


def _taken_position(session_id: str, index: int, next_index: int) -> WriteConflictError:
    return WriteConflictError(
        f"session {session_id}: message index {index} is not the next position {next_index}"
    )


def _taken_step(session_id: str, step_id: str) -> WriteConflictError:
    return WriteConflictError(f"session {session_id}: step {step_id} is already stored")


def _seq_not_increasing(session_id: str, seq: int | None) -> WriteConflictError:
    return WriteConflictError(f"session {session_id}: event seq {seq} is not increasing")


def _not_json(write: Write | None, exc: Exception) -> StoreError:
    """The refusal of a row ``_add_rows`` could not encode, worded as ``_json`` words it."""
    if isinstance(write, PutStep):
        return StoreError(f"cannot store step {write.step_id} as JSON: {exc}")
    what = "an event" if isinstance(write, LogEvent) else "a message"
    return StoreError(f"cannot store {what} as JSON: {exc}")


def _forget_step(
    steps: dict[str, tuple[str, bytes]], of_turn: dict[str, bytes], step_id: str
) -> None:
    """Undo a ``put_step``: the step goes from the session's and its turn's steps."""
    del steps[step_id]
    del of_turn[step_id]


class _MemoryTransaction:
    """Applies each write at once and keeps how to undo it, so that a commit whose work
    raises leaves the session as it found it (``rollback``), as a SQL store would."""

    def __init__(
        self,
        data: _SessionData,
        session_id: str,
        payloads: Payloads,
        blobs: BlobStore | None = None,
        ledger: dict[tuple[str, str], Spend] | None = None,
    ) -> None:
        self._data = data
        #: The store's usage ledger: ``(tenant, bucket)`` to what it spent.
        self._ledger: dict[tuple[str, str], Spend] = ledger if ledger is not None else {}
        self._session_id = session_id
        self._payloads = payloads
        self._blobs = blobs
        self._put = blobs.put if blobs is not None and payloads.threshold is not None else None
        #: The size past which a payload spills to the blobs (``None``: none spills).
        self._spill_over = payloads.threshold if self._put is not None else None
        #: Blob deletions to make once the commit has applied every write.
        self.after: list[Callable[[], None]] = []
        #: What this commit has spilled so far (see ``Payloads.spill``), once it has.
        self._seen: Seen | None = None
        #: The session's fields as the commit found them (its scalars, and which
        #: containers are live: a reset swaps them), kept before the first write to one.
        self._fields: dict[str, Any] | None = None
        #: Undoes each write made to a container, in the order they were made.
        self._undo: list[Callable[[], object]] = []

    def rollback(self) -> None:
        for undo in reversed(self._undo):
            undo()
        if self._fields is not None:
            vars(self._data).update(self._fields)

    def count_usage(self, w: CountUsage) -> None:
        spent = Spend(w.input_tokens, w.output_tokens, float(w.cost), 1)
        sid = self._session_id
        for key in ((w.tenant, session_bucket(sid)), (w.tenant, tenant_bucket(sid))):
            before = self._ledger.get(key)
            self._ledger[key] = (before or NO_SPEND) + spent
            self._undo.append(partial(self._restore, key, before))

    def _restore(self, key: tuple[str, str], before: Spend | None) -> None:
        if before is None:
            self._ledger.pop(key, None)
        else:
            self._ledger[key] = before

    def _keep_fields(self) -> None:
        if self._fields is None:
            self._fields = dict(vars(self._data))

    def _encode(self, kind: PayloadKind, value: Any, turn_id: str, what: str, name: str) -> bytes:
        """``value`` as kept: its JSON, spilled and sealed as the store is set to;
        refused, naming ``what`` (and ``name``), if it is not JSON."""
        encoded = _json(value, what, name)
        over = self._spill_over
        if over is not None and len(encoded) > over:
            assert self._put is not None  # (set with the threshold)
            if self._seen is None:
                self._seen = Seen()
            sid = self._session_id
            encoded = self._payloads.spill(self._put, self._seen, sid, turn_id, value, encoded)
        codec = self._payloads.codec
        return encoded if codec is None else self._payloads.seal(self._session_id, kind, encoded)

    def _put_turn(self, record: KeptTurn) -> None:
        turns, turn_id = self._data.turns, record.record.turn_id
        before = turns.get(turn_id)
        turns[turn_id] = record
        if before is None:
            self._undo.append(partial(turns.pop, turn_id))
        else:
            self._undo.append(partial(turns.__setitem__, turn_id, before))

    def append_message(self, index: int, message: Message) -> None:
        if index != len(self._data.messages):
            raise _taken_position(self._session_id, index, len(self._data.messages))
        messages = self._data.messages
        body = self._encode("message", message.to_dict(), message.turn_id, "a message", "")
        messages.append(body)
        self._undo.append(messages.pop)

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        steps = self._data.steps
        if step_id in steps:
            raise _taken_step(self._session_id, step_id)
        encoded = self._encode("step", result, turn_id, "step ", step_id)
        steps[step_id] = (turn_id, encoded)
        of_turns = self._data.turn_steps
        mine = of_turns.get(turn_id)
        if mine is None:  # (not setdefault: it would make a dict to drop every step)
            mine = of_turns[turn_id] = {}
        mine[step_id] = encoded
        self._undo.append(partial(_forget_step, steps, mine, step_id))

    def log_event(self, event: TurnEvent) -> None:
        events = self._data.events
        if event.seq is None or (events and event.seq <= events[-1][0]):
            raise _seq_not_increasing(self._session_id, event.seq)
        body = self._encode("event", event.to_dict(), event.turn_id, "an event", "")
        events.append((event.seq, event.turn_id, body))
        self._undo.append(events.pop)

    def request_cancel(self, turn_id: str, reason: str) -> None:
        kept = self._data.turns.get(turn_id)
        if kept is None:
            raise StoreError(f"session {self._session_id}: no turn {turn_id} to cancel")
        self._put_turn(_cancelled(kept, first_cancel_reason(kept.record.cancel_reason, reason)))

    def archive_generation(self, generation: int, agent: str) -> None:
        self._keep_fields()
        d = self._data
        if generation != d.generation or generation in d.archive:
            raise GenerationArchivedError(
                f"session {self._session_id}: generation {generation} is not the live one "
                f"({d.generation}); another reset came first"
            )
        d.archive[generation] = d.messages
        d.archived_at = {**d.archived_at, generation: time.time()}  # replaced: see rollback
        self._undo.append(partial(d.archive.pop, generation))
        d.archived_seq = d.events[-1][0] if d.events else d.archived_seq
        # Queued turns (and their steps) stay: they run in the new generation.
        queued = {t: r for t, r in d.turns.items() if r.record.status == "queued"}
        retired = frozenset(t for t in d.turns if t not in queued)
        d.archived_turns = {**d.archived_turns, generation: retired}
        d.steps = {s: v for s, v in d.steps.items() if v[0] in queued}
        d.turn_steps = {t: v for t, v in d.turn_steps.items() if t in queued}
        d.messages, d.events, d.turns, d.trimmed = [], [], queued, frozenset()
        d.generation = generation + 1
        d.agent = agent
        d.reset_requested = None
        self._touch("new")

    def erase_session(self, by: str | None) -> None:
        d = self._data
        if d.agent is None:
            return  # never seen: nothing to erase
        self._keep_fields()  # every container below is replaced, never changed in place
        d.archived_seq = d.events[-1][0] if d.events else d.archived_seq
        d.messages, d.events, d.turns, d.archive = [], [], {}, {}
        d.trimmed = frozenset()
        d.steps, d.turn_steps, d.archived_at, d.archived_turns = {}, {}, {}, {}
        d.generation += 1
        d.reset_requested = None
        d.erased = Erasure(by, time.time())
        self._touch("new")
        if self._blobs is not None:
            self.after.append(partial(self._blobs.delete_session, self._session_id))

    def drop_generation(self, generation: int) -> None:
        d = self._data
        if generation not in d.archive:
            return
        self._keep_fields()  # the dicts are replaced, never changed in place
        d.archive = {g: m for g, m in d.archive.items() if g != generation}
        d.archived_at = {g: t for g, t in d.archived_at.items() if g != generation}
        retired = d.archived_turns.get(generation, frozenset())
        d.archived_turns = {g: t for g, t in d.archived_turns.items() if g != generation}
        if self._blobs is not None:
            elsewhere = set(d.turns).union(*d.archived_turns.values())
            only = sorted(retired - elsewhere)
            self.after.append(partial(self._blobs.delete_turns, self._session_id, only))

    def trim_events(self, turn_id: str) -> None:
        d = self._data
        kept = d.turns.get(turn_id)
        if kept is None or kept.record.finished_at is None:
            return
        self._keep_fields()  # both are replaced, never changed in place
        last = max((seq for seq, tid, _ in d.events if tid == turn_id), default=None)
        d.events = [e for e in d.events if e[1] != turn_id or e[0] == last]
        d.trimmed = d.trimmed | {turn_id}

    def prune_session(self, idle_before: float) -> None:
        d = self._data
        busy = any(t.record.status in UNFINISHED for t in d.turns.values())
        if d.agent is None or d.updated_at >= idle_before or d.reset_requested is not None or busy:
            return
        self._keep_fields()
        vars(d).update(vars(_SessionData()))  # as if never seen
        if self._blobs is not None:
            self.after.append(partial(self._blobs.delete_session, self._session_id))

    def request_reset(self) -> None:
        d = self._data
        if d.agent is None:
            return  # never seen: nothing to reset
        self._keep_fields()
        if d.reset_requested is None:
            d.reset_requested = time.time()
        for kept in list(d.turns.values()):
            if kept.record.status in UNFINISHED and not kept.record.cancel_reason:
                self._put_turn(_cancelled(kept, "reset"))

    def drop_reset(self) -> None:
        self._keep_fields()
        self._data.reset_requested = None

    def put_turn(
        self,
        record: TurnRecord,
        expect: TurnStatus | None,
        session_status: SessionStatus | None,
        owner: str | None,
    ) -> None:
        turn_id = record.turn_id
        stored = self._data.turns.get(turn_id)
        if expect is None:
            if stored is not None:
                raise TurnMoveError(
                    f"session {self._session_id}: turn {turn_id} already exists "
                    f"({stored.record.status})"
                )
            self._keep_fields()
            if self._data.agent is None:  # the turn creates the session
                self._data.owner, self._data.agent = owner, record.agent
            ordered = replaced(record, created_at=self._next_order())
            self._put_turn(self._payloads.keep_turn(ordered))
        else:
            if stored is None or stored.record.status != expect:
                found = "no such turn" if stored is None else f"it is {stored.record.status}"
                raise TurnMoveError(
                    f"session {self._session_id}: turn {turn_id} was to move from {expect} "
                    f"to {record.status}, but {found}"
                )
            # What a move changes; its opening and event stay as kept.
            payloads, sid = self._payloads, stored.record.session_id
            self._put_turn(
                KeptTurn(
                    record=replaced(
                        stored.record,
                        status=record.status,
                        finished_at=record.finished_at,
                        version=record.version,
                        held_by=record.held_by,
                        wake_at=record.wake_at,
                    ),
                    opening=stored.opening,
                    event=stored.event,
                    pending=payloads.pending(sid, record),
                    text=payloads.dump_text(sid, "text", record.text),
                    error=payloads.dump_text(sid, "error", record.error),
                )
            )
        if session_status is not None:
            self._keep_fields()
            self._data.agent = record.agent
            self._touch(session_status)
        elif expect is None:
            self._touch(self._data.status)

    def _next_order(self) -> float:
        """When a new turn of the session sorts: now, and after its latest turn (as
        the SQL stores order them; see ``_sql.new_turn``)."""
        latest = max((t.record.created_at for t in self._data.turns.values()), default=0.0)
        return max(time.time(), latest + 0.000001)

    def _touch(self, status: SessionStatus) -> None:
        self._keep_fields()
        self._data.status = status
        self._data.updated_at = time.time()


class _MemorySession:
    def __init__(
        self,
        session_id: str,
        data: _SessionData,
        locks: SessionLocks,
        store_id: str,
        payloads: Payloads,
        blobs: BlobStore | None = None,
        ledger: dict[tuple[str, str], Spend] | None = None,
    ) -> None:
        self._session_id = session_id
        self._data = data
        self._locks = locks
        self._store_id = store_id
        self._payloads = payloads
        self._blobs = blobs
        self._ledger: dict[tuple[str, str], Spend] = ledger if ledger is not None else {}
        #: Whether every payload is kept as its bare JSON (no codec, nothing spills):
        #: then a commit of rows alone takes the short way (``_add_rows``).
        self._plain = payloads.codec is None and (blobs is None or payloads.threshold is None)

    async def spend(self, tenant: str) -> tuple[Spend, Spend]:
        """What this session spent, and what ``tenant`` did (see ``UsageLedger``)."""
        mine = self._ledger.get((tenant, session_bucket(self._session_id)), NO_SPEND)
        of_tenant = NO_SPEND
        for (t, bucket), spent in self._ledger.items():
            if t == tenant and bucket.startswith("t:"):
                of_tenant = of_tenant + spent
        return mine, of_tenant

    def _load(self, kind: PayloadKind, kept: bytes) -> Any:
        if self._payloads.codec is None and self._payloads.threshold is None:
            return from_json(kept)
        return self._payloads.load(self._session_id, kind, kept)

    def writer(self) -> AbstractAsyncContextManager[None]:
        return self._locks.hold(self._session_id)

    @property
    def session_id(self) -> str:
        return self._session_id

    async def load(self, turn_id: str | None = None, *, from_index: int = 0) -> SessionSnapshot:
        d = self._data
        steps = (
            {k: self._load("step", r) for k, r in d.turn_steps.get(turn_id, {}).items()}
            if turn_id is not None
            else {}
        )
        last_seq = d.events[-1][0] if d.events else d.archived_seq
        return SessionSnapshot(
            messages=[
                message_from_dict(self._load("message", m))
                for m in d.messages[max(0, from_index) :]
            ],
            store_id=self._store_id,
            steps=StepResults(steps),
            turn=await self.turn(turn_id) if turn_id is not None else None,
            agent=d.agent,
            next_seq=last_seq + 1,
            generation=d.generation,
            from_index=from_index,
            owner=d.owner,
            reset_requested=d.reset_requested is not None,
            erased=d.erased,
        )

    async def commit(self, writes: Sequence[Write]) -> None:
        if self._plain and self._add_rows(writes):
            return
        tx = _MemoryTransaction(
            self._data, self._session_id, self._payloads, self._blobs, self._ledger
        )
        try:
            apply_writes(tx, writes)
        except BaseException:
            tx.rollback()
            raise
        for delete in tx.after:
            delete()

    def _add_rows(self, writes: Sequence[Write]) -> bool:
        """Make a commit of messages, steps and events only (every step's commit), and
        say so; False, with nothing made, for any other commit.

        Each row is checked and encoded before any is added, so a refused one leaves
        the session as it was without the undo log a transaction keeps."""
        d, sid = self._data, self._session_id
        messages, steps, events = d.messages, d.steps, d.events
        next_index = len(messages)
        last_seq = events[-1][0] if events else None
        new_messages: list[bytes] = []
        new_steps: dict[str, tuple[str, bytes]] = {}
        new_events: list[tuple[int, str, bytes]] = []
        w: Write | None = None
        try:
            for w in writes:
                if type(w) is AppendMessage:
                    if w.index != next_index:
                        raise _taken_position(sid, w.index, next_index)
                    new_messages.append(kept_json_bytes(w.message.to_dict()))
                    next_index += 1
                elif type(w) is PutStep:
                    step_id = w.step_id
                    if step_id in steps or step_id in new_steps:
                        raise _taken_step(sid, step_id)
                    new_steps[step_id] = (w.turn_id, kept_json_bytes(w.result))
                elif type(w) is LogEvent:
                    event = w.event
                    seq = event.seq
                    if seq is None or (last_seq is not None and seq <= last_seq):
                        raise _seq_not_increasing(sid, seq)
                    new_events.append((seq, event.turn_id, kept_json_bytes(event.to_dict())))
                    last_seq = seq
                else:
                    return False
        except WriteConflictError:
            raise
        except Exception as exc:  # (only to_json raises: a value that is not JSON)
            raise _not_json(w, exc) from exc
        messages.extend(new_messages)
        events.extend(new_events)
        if new_steps:
            steps.update(new_steps)
            of_turns = d.turn_steps
            for step_id, (turn_id, encoded) in new_steps.items():
                mine = of_turns.get(turn_id)
                if mine is None:
                    mine = of_turns[turn_id] = {}
                mine[step_id] = encoded
        return True

    async def run_tool(self, step: ToolStep[T]) -> T:
        # The tool runs on a worker thread, so blocking in it stalls no other
        # session; its step's writes are made here, on the event loop, afterwards.
        result, writes = await on_thread(_TOOL_THREADS, step, _NO_HANDLE)
        await self.commit(writes)
        return result

    async def turn(self, turn_id: str) -> TurnRecord | None:
        kept = self._data.turns.get(turn_id)
        return self._payloads.turn(kept) if kept is not None else None

    async def cancel_reason(self, turn_id: str) -> str | None:
        kept = self._data.turns.get(turn_id)
        return kept.record.cancel_reason if kept is not None else None

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        return [
            event_from_dict(self._load("event", body))
            for seq, tid, body in self._data.events
            if seq > after and (turn_id is None or tid == turn_id)
        ]

    async def status(self) -> SessionStatus:
        return self._data.status

    async def generations(self) -> list[int]:
        return sorted(self._data.archive)

    async def archived_messages(self, generation: int) -> list[Message]:
        archived = self._data.archive.get(generation, [])
        return [message_from_dict(self._load("message", m)) for m in archived]

    async def unfinished(self) -> list[TurnRecord]:
        found = [t for t in self._data.turns.values() if t.record.status in UNFINISHED]
        return [self._payloads.turn(t) for t in sorted(found, key=_created)]


class MemoryStore:
    """Every session in a dict. Fast, and gone when the process exits. ``codec`` seals
    each payload as a durable store would (for testing a ``turnkit.Codec``); ``blobs``
    keeps payloads over ``blob_threshold`` bytes apart, as a durable store would (for
    testing a ``turnkit.BlobStore``)."""

    def __init__(
        self,
        *,
        codec: Codec | None = None,
        blobs: BlobStore | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
    ) -> None:
        if blobs is not None and not isinstance(blobs, BlobStore):
            raise ConfigurationError(
                f"MemoryStore blobs must be a BlobStore, got {type(blobs).__name__}"
            )
        self.blobs = blobs
        self._payloads = Payloads(
            codec,
            binary=True,
            threshold=blob_threshold,
            get_blob=blobs.get if blobs is not None else None,
        )
        self._sessions: dict[str, _SessionData] = {}
        self._ledger: dict[tuple[str, str], Spend] = {}
        self._locks = SessionLocks()
        #: This store's identity: random, for as long as the object (its data) lives.
        self.store_id = secrets.token_hex(16)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def session(self, session_id: str) -> _MemorySession:
        data = self._sessions.setdefault(session_id, _SessionData())
        return _MemorySession(
            session_id, data, self._locks, self.store_id, self._payloads, self.blobs, self._ledger
        )

    async def _infos(self) -> list[SessionInfo]:
        return [
            SessionInfo(
                session_id=sid,
                agent=d.agent,
                status=d.status,
                updated_at=d.updated_at,
                preview=_preview(sid, d.messages, self._payloads),
                owner=d.owner,
            )
            for sid, d in sorted(self._sessions.items())
            if d.agent is not None
        ]

    async def session_page(
        self,
        *,
        agent: str | None = None,
        limit: int,
        after: SessionKey | None = None,
        owner: str | None = None,
    ) -> list[SessionInfo]:
        return newest_first(await self._infos(), agent=agent, limit=limit, after=after, owner=owner)

    async def unfinished_turns(self) -> list[TurnRecord]:
        found = [
            t
            for d in self._sessions.values()
            for t in d.turns.values()
            if t.record.status in ("queued", "running")
            or (t.record.status == "suspended" and t.record.held_by)
        ]
        return [self._payloads.turn(t) for t in sorted(found, key=_created)]

    async def parked_turns(
        self, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[TurnRecord]:
        """See ``turnkit.stores.InboxStore``."""
        start = after or (float("-inf"), "", "")
        found = sorted(
            ((t.record.created_at, sid, tid), t)
            for sid, d in self._sessions.items()
            for tid, t in d.turns.items()
            if t.record.status == "suspended" and (t.record.created_at, sid, tid) > start
        )
        return [self._payloads.turn(t) for _, t in found[:limit]]

    def _waking(self) -> list[TurnRecord]:
        """The plain fields of every parked turn the clock has something to do for."""
        return [
            t.record
            for d in self._sessions.values()
            for t in d.turns.values()
            if t.record.status == "suspended" and t.record.wake_at is not None
        ]

    async def due_turns(self, before: float, *, limit: int) -> list[TurnRecord]:
        """See ``turnkit.stores.TimerStore``."""
        due = sorted(
            (t for t in self._waking() if t.wake_at is not None and t.wake_at <= before),
            key=lambda t: (t.wake_at, t.session_id, t.turn_id),
        )
        return [
            self._payloads.turn(self._sessions[t.session_id].turns[t.turn_id]) for t in due[:limit]
        ]

    async def next_wake(self) -> float | None:
        """See ``turnkit.stores.TimerStore``."""
        times = [t.wake_at for t in self._waking() if t.wake_at is not None]
        return min(times) if times else None

    async def idle_sessions(
        self, before: float, *, limit: int, after: tuple[float, str] | None = None
    ) -> list[tuple[float, str]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "")
        found = sorted(
            (d.updated_at, sid)
            for sid, d in self._sessions.items()
            if d.agent is not None
            and d.updated_at < before
            and (d.updated_at, sid) > start
            and d.reset_requested is None
            and not any(t.record.status in UNFINISHED for t in d.turns.values())
        )
        return found[:limit]

    async def old_generations(
        self, before: float, *, limit: int, after: tuple[float, str, int] | None = None
    ) -> list[tuple[float, str, int]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "", -1)
        found = sorted(
            (at, sid, generation)
            for sid, d in self._sessions.items()
            for generation, at in d.archived_at.items()
            if at < before and (at, sid, generation) > start
        )
        return found[:limit]

    async def ended_turns(
        self, before: float, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[tuple[float, str, str]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "", "")
        found = sorted(
            (t.finished_at, sid, tid)
            for sid, d in self._sessions.items()
            for tid, t in ((tid, kept.record) for tid, kept in d.turns.items())
            if t.finished_at is not None
            and tid not in d.trimmed
            and t.finished_at < before
            and (t.finished_at, sid, tid) > start
        )
        return found[:limit]

    async def sessions_of_tenant(self, tenant: str, session_ids: Sequence[str]) -> set[str]:
        """See ``turnkit.stores.TenantView``."""
        found = set()
        for session_id in session_ids:
            data = self._sessions.get(session_id)
            if data is not None and any(t.record.tenant == tenant for t in data.turns.values()):
                found.add(session_id)
        return found

    async def usage_by_tenant(self) -> dict[str, Spend]:
        """What each tenant spent on model calls (see ``UsageLedger``)."""
        found: dict[str, Spend] = {}
        for (tenant, bucket), spent in sorted(self._ledger.items()):
            if bucket.startswith("t:"):
                found[tenant] = found.get(tenant, NO_SPEND) + spent
        return found

    async def turn_counts(self) -> dict[str, int]:
        """How many turns are ``queued``, ``running`` and ``suspended`` (for monitoring)."""
        counts = {"queued": 0, "running": 0, "suspended": 0}
        for data in self._sessions.values():
            for kept in data.turns.values():
                if kept.record.status in counts:
                    counts[kept.record.status] += 1
        return counts


def _created(kept: KeptTurn) -> float:
    return kept.record.created_at


def _cancelled(kept: KeptTurn, reason: str) -> KeptTurn:
    """``kept`` with its cancellation recorded as ``reason``."""
    return KeptTurn(
        record=replaced(kept.record, cancel_reason=reason),
        opening=kept.opening,
        event=kept.event,
        pending=kept.pending,
        text=kept.text,
        error=kept.error,
    )


def _preview(session_id: str, messages: list[bytes], payloads: Payloads) -> str | None:
    """The preview of a session whose encoded transcript is ``messages``."""
    if not messages:
        return None
    return preview_of(payloads.first_text(session_id, messages[0]))
