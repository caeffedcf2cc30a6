"""What the operator console reads from the store, as JSON-ready values.

Everything comes through the store seam: session pages by key
(``Store.session_page``), one session whole (``read_recorded``), and the live
counts (``Store.turn_counts`` where the store has it, else its unfinished turns).
A turn's timeline is made from its logged events, whose ``at`` stamps give each
step's start and end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._runtime.recorded import RecordedSession
from .._seams.store import Store
from .._seams.tenant_view import TenantView
from .._values.events import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    InputAnsweredEvent,
    InputExpiredEvent,
    InputReminderEvent,
    InputRequestedEvent,
    MessageCompletedEvent,
    StepRetryEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnHeldEvent,
    TurnStartedEvent,
)
from .._values.messages import AssistantMessage
from .._values.records import SessionInfo, SessionKey, TurnRecord
from .._values.times import rfc3339

#: Most rows one session-list request reads from the store while it filters by
#: status, so a rare status costs a bounded scan; the answer says where to go on.
SCAN_BUDGET = 5_000
_PAGE = 500
STATUSES = frozenset({"new", "running", "suspended", "idle"})


@dataclass(frozen=True, kw_only=True)
class SessionFilter:
    """A session-list request: ``agent``, session ``status``, ``tenant`` (sessions
    with a turn of it), and age by last update (``newer_than``/``older_than``,
    seconds before now)."""

    agent: str | None = None
    status: str | None = None
    tenant: str | None = None
    newer_than: float | None = None
    older_than: float | None = None
    limit: int = 50


async def session_rows(
    store: Store, wanted: SessionFilter, after: SessionKey | None, now: float | None = None
) -> tuple[list[SessionInfo], SessionKey | None, int]:
    """Up to ``wanted.limit`` sessions that pass the filter, newest first, after the
    key ``after``; the key to go on from (``None``: the end) and how many rows
    were read. Paging is by key, so a page costs the same at any depth. A status
    or tenant filter reads pages until it has ``limit`` rows or has read
    ``SCAN_BUDGET``; the tenant is asked of the store once a page (``TenantView``)."""
    now = time.time() if now is None else now
    if after is None and wanted.older_than is not None:
        after = (now - wanted.older_than, "")
    floor = None if wanted.newer_than is None else now - wanted.newer_than
    found: list[SessionInfo] = []
    scanned = 0
    narrowed = wanted.status is not None or wanted.tenant is not None
    chunk = _PAGE if narrowed else wanted.limit
    while True:
        page = await store.session_page(agent=wanted.agent, limit=chunk, after=after)
        scanned += len(page)
        tenants: set[str] | None = None
        if wanted.tenant is not None and isinstance(store, TenantView):
            ids = [i.session_id for i in page]
            tenants = await store.sessions_of_tenant(wanted.tenant, ids) if ids else set()
        for info in page:
            after = (info.updated_at, info.session_id)
            if floor is not None and info.updated_at < floor:
                return found, None, scanned
            if tenants is not None and info.session_id not in tenants:
                continue
            if wanted.status is None or info.status == wanted.status:
                found.append(info)
                if len(found) == wanted.limit:
                    return found, after, scanned
        if len(page) < chunk:
            return found, None, scanned
        if scanned >= SCAN_BUDGET:
            return found, after, scanned


def session_row(info: SessionInfo) -> dict[str, Any]:
    return {
        "session_id": info.session_id,
        "agent": info.agent,
        "status": info.status,
        "updated_at": info.updated_at,
        "updated": rfc3339(info.updated_at),
        "preview": info.preview,
        "owner": info.owner,
    }


async def live_counts(store: Store) -> dict[str, Any]:
    """Queue depth and turns running or parked now, and the running ones (at most
    20), read from the store."""
    counts_of = getattr(store, "turn_counts", None)
    unfinished = await store.unfinished_turns()
    if counts_of is not None:
        counts = dict(await counts_of())
    else:
        counts = {"queued": 0, "running": 0, "suspended": 0}
        for record in unfinished:
            counts[record.status] = counts.get(record.status, 0) + 1
    running = [r for r in unfinished if r.status == "running"][:20]
    return {
        "at": time.time(),
        "queued": counts.get("queued", 0),
        "running": counts.get("running", 0),
        "parked": counts.get("suspended", 0),
        "running_turns": [
            {"session_id": r.session_id, "turn_id": r.turn_id, "agent": r.agent, "tenant": r.tenant}
            for r in running
        ],
    }


def session_detail(
    recorded: RecordedSession,
    status: str,
    generations: list[int],
    writers: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """One session for its page: the transcript, and each turn with its record,
    steps and timeline (newest turn first); ``writers`` as in ``timeline``."""
    by_turn: dict[str, list[TurnEvent]] = {}
    for event in recorded.events:
        by_turn.setdefault(event.turn_id, []).append(event)
    replies: dict[str, list[int]] = {}  # each turn's model replies' positions
    asked_at: dict[str, int] = {}  # each tool call's reply's position
    for index, message in enumerate(recorded.messages):
        if isinstance(message, AssistantMessage):
            replies.setdefault(message.turn_id, []).append(index)
            for call in message.tool_calls:
                asked_at[call.id] = index
    turns = []
    for turn in reversed(recorded.turns):
        record = turn.record
        steps_of = timeline(by_turn.get(turn.turn_id, []), writers)
        _fork_points(steps_of, replies.get(turn.turn_id, []), asked_at)
        turns.append(
            {
                "turn_id": turn.turn_id,
                "status": record.status if record else None,
                "error": record.error if record else None,
                "text": record.text if record else None,
                "cancel_reason": record.cancel_reason if record else None,
                "created": rfc3339(record.created_at or None) if record else None,
                "finished": rfc3339(record.finished_at) if record else None,
                "pending": _pending(record),
                "steps": sorted(turn.steps),
                "tenant": record.tenant if record else None,
                "timeline": steps_of,
            }
        )
    return {
        "session_id": recorded.session_id,
        "agent": recorded.agent,
        "owner": recorded.owner,
        "status": status,
        "generations": generations,
        "workers_recorded": writers is not None,
        "messages": [{"index": i, **m.to_dict()} for i, m in enumerate(recorded.messages)],
        "turns": turns,
    }


def _fork_points(items: list[dict[str, Any]], replies: list[int], asked_at: dict[str, int]) -> None:
    """Give each model and tool step its fork point (``fork_at``, as ``fork_session``
    takes it): the n-th model step of a turn is its n-th reply in the transcript,
    a tool call is cut at the reply that asked for it. A step the transcript no
    longer holds (compacted away, say) gets none."""
    models = iter(replies)
    for item in items:
        item["fork_at"] = None
        if item["kind"] == "model":
            index = next(models, None)
            item["fork_at"] = None if index is None else f"model:{index}"
        elif item["kind"] == "tool" and item.get("call_id") in asked_at:
            item["fork_at"] = f"tool:{asked_at[item['call_id']]}:{item['call_id']}"


def _pending(record: TurnRecord | None) -> list[dict[str, Any]]:
    if record is None or record.status != "suspended" or record.pending is None:
        return []
    return [r.to_dict() for r in record.pending.requests]


#: Events after which no delivery runs the turn until something resumes (or
#: retries) it: the next one may be any process's, and is no takeover.
_DELIVERY_ENDS = (
    InputRequestedEvent,
    StepRetryEvent,
    TurnHeldEvent,
    TurnCompletedEvent,
    TurnFailedEvent,
    TurnCancelledEvent,
)
#: Events a delivery logs (not a resume's answer or a timer's firing), whose
#: writer tells which process ran the turn at that point.
_DELIVERED = (
    TurnStartedEvent,
    MessageCompletedEvent,
    ActionRequestedEvent,
    ActionCompletedEvent,
    *_DELIVERY_ENDS,
)


def timeline(
    events: Sequence[TurnEvent], writers: Mapping[int, str] | None = None
) -> list[dict[str, Any]]:
    """The turn's steps on a time axis: each a ``kind`` (``model``, ``tool``,
    ``park``, ``retry``, ``reminder``, ``takeover``, ``end``), a ``label``,
    ``start``/``end`` (seconds since the epoch), ``error`` for a failure, ``by`` for
    who answered a park, and ``worker``: the process that committed it, from
    ``writers`` (``{seq: holder}``, see ``WorkerView.event_writers``; ``None`` where
    the store does not record it). A ``takeover`` is where a delivery event was
    written by another process than the one running the turn before it, with no
    park between: that process died or stalled, and this one took the turn on."""
    writers = writers or {}
    items: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    park: dict[str, Any] | None = None
    mark: float | None = None  # where the next model step starts
    running_on: str | None = None  # the process delivering the turn now
    last_at: float | None = None  # the last event's time
    for event in events:
        at = event.at
        if at is None:
            continue
        worker = writers.get(event.seq) if event.seq is not None else None
        if worker is not None and isinstance(event, _DELIVERED):
            if running_on is not None and worker != running_on:
                taken = _item(
                    "takeover", f"taken over by {worker}", last_at or at, at, worker=worker
                )
                taken["from"] = running_on
                items.append(taken)
            running_on = None if isinstance(event, _DELIVERY_ENDS) else worker
        last_at = at
        if isinstance(event, TurnStartedEvent):
            mark = at
        elif isinstance(event, MessageCompletedEvent):
            calls_made = [c.name for c in event.message.tool_calls]
            label = "model → " + (", ".join(calls_made) if calls_made else "answer")
            start = mark if mark is not None else at
            items.append(_item("model", label, start, at, worker=worker))
            mark = at
        elif isinstance(event, ActionRequestedEvent):
            item = _item("tool", event.call.name, at, None)
            item["call_id"] = event.call.id
            calls[event.call.id] = item
            items.append(item)
        elif isinstance(event, ActionCompletedEvent):
            item = calls.pop(event.call_id, {})
            if not item:
                item = _item("tool", event.name, at, None)
                item["call_id"] = event.call_id
                items.append(item)
            item["end"] = at
            item["error"] = event.error
            item["worker"] = worker
            mark = at
        elif isinstance(event, StepRetryEvent):
            # Logged after the park it waits in: that park is this retry's wait.
            fresh = park is not None and park["kind"] == "park" and park.get("timer")
            wait = park if fresh else None
            if wait is None:
                wait = _item("retry", "", at, None, worker=worker)
                items.append(wait)
            wait.update(
                kind="retry",
                label=f"retry {event.attempt} of {event.step_id}",
                error=event.error,
                retry_at=event.retry_at,
            )
        elif isinstance(event, InputRequestedEvent):
            if park is None:
                ids = ", ".join(r.id for r in event.requests)
                park = _item("park", f"waiting for {ids}", at, None, worker=worker)
                park["timer"] = all(r.kind == "timer" for r in event.requests)
                items.append(park)
        elif isinstance(event, InputAnsweredEvent | InputExpiredEvent):
            if park is not None:
                park["end"] = at
                if isinstance(event, InputAnsweredEvent):
                    park["by"] = event.by
                else:
                    timer = park.get("timer")
                    park["by"] = "timer" if timer else "deadline"
                    park["label"] += (
                        " · timer fired" if timer else f" · deadline passed ({event.action})"
                    )
                    park["late_by"] = event.late_by
                park = None
            mark = at
        elif isinstance(event, InputReminderEvent):
            items.append(_item("reminder", f"reminder {event.reminder}: {event.input_id}", at, at))
        elif isinstance(event, TurnFailedEvent | TurnCompletedEvent | TurnCancelledEvent):
            error = event.error if isinstance(event, TurnFailedEvent) else None
            for item in calls.values():  # what the ending cut short
                item["end"], item["error"] = at, error
            calls.clear()
            if isinstance(event, TurnFailedEvent):
                end = _item("end", "failed", at, at, error=event.error, worker=worker)
            elif isinstance(event, TurnCompletedEvent):
                end = _item("end", "completed", at, at, worker=worker)
            else:
                end = _item("end", f"cancelled ({event.reason})", at, at, worker=worker)
            items.append(end)
    return items


def _item(
    kind: str,
    label: str,
    start: float,
    end: float | None,
    *,
    error: str | None = None,
    worker: str | None = None,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "label": label,
        "start": start,
        "end": end,
        "error": error,
        "by": None,
        "worker": worker,
    }
