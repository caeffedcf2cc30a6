"""Forking a session: a new session holding the original's history up to a step.

The fork is planned from what the original stores (``recorded.read_recorded``) as
ordinary writes (``PutTurn`` through ``turn_rules``, ``PutStep``, ``AppendMessage``,
``LogEvent``) and committed to the new session in one transaction, so every store
does it and nothing before the fork point runs again. What the fork holds is what
the original would hold had its process died just before the fork point: the turn
cut there is stored ``running``, and its next delivery (``AgentSession.redeliver``,
``runtime.recover()``, a worker) carries it on from there, with whatever model,
tools and answers the fork's runtime has now. The original is only read.

Where a fork starts (``at``):

- ``None``: the end of the live transcript. The turns are copied as they are (a
  parked turn stays parked on the same questions, ready for another answer); tool
  results a batch committed whose messages are not in the transcript yet are kept.
- an ``int`` ``p``: the first ``p`` messages. A tool batch the cut falls inside keeps
  the results of the calls answered before ``p``; the others run again.
- ``"model:<n>"``: just before that model step (the reply at position ``n``).
- ``"tool:<n>:<call>"``: just before that tool call: the reply at ``n`` and the
  results of the calls it made before ``<call>`` (in the model's order) are kept;
  ``<call>`` and the calls after it run again.

The turn cut at the fork point loses the answers its questions got and its trace
context (a fork asks again, and traces anew); turns wholly before it are copied
whole, with their event log. Turns with no message yet (queued) are not copied.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from .._errors import ConfigurationError
from .._seams.store import NO_MESSAGES, SessionStore, Store
from .._values.messages import AssistantMessage, Message, ToolMessage, TriggerMessage, UserMessage
from .._values.records import TurnRecord, TurnStatus
from .._values.step_ids import (
    INPUT,
    MODEL,
    NOTE,
    TOOL,
    TRACE,
    noted_call,
    step_kind,
    step_position,
)
from .._values.turn_rules import move, new_turn
from .._values.writes import AppendMessage, LogEvent, PutStep, RequestCancel, Write
from .recorded import RecordedSession, RecordedTurn, read_recorded


@dataclass(frozen=True, kw_only=True)
class ForkResult:
    """What a fork made. ``at`` is how many messages it copied; ``turn_id`` is the
    turn at the fork point and ``status`` its status in the fork (``running``: cut
    there, to be delivered again; else copied as it was)."""

    source: str
    session_id: str
    agent: str
    at: int
    turn_id: str
    status: TurnStatus
    turns: int
    steps: int
    events: int


@dataclass(frozen=True)
class _Cut:
    """Where the fork cuts: ``position`` messages kept; ``exact`` keeps every tool
    result committed at the last batch; ``batch``/``calls``: a tool step's fork keeps
    those calls' results of the batch at ``batch``."""

    position: int
    exact: bool = False
    batch: int | None = None
    calls: frozenset[str] = frozenset()


def fork_point(messages: list[Message], at: int | str | None) -> _Cut:
    """Read ``at`` against the transcript; ``ValueError`` naming what does not fit."""
    end = len(messages)
    if at is None:
        if end == 0:
            raise ValueError("the session's transcript is empty: there is nothing to fork")
        return _Cut(end, exact=True)
    if isinstance(at, bool) or not isinstance(at, int | str):
        raise TypeError(f"at must be a step id, a transcript position or None, got {at!r}")
    if isinstance(at, int):
        if not 1 <= at <= end:
            raise ValueError(f"fork position {at} is outside the transcript (1 to {end})")
        return _Cut(at, exact=at == end)
    kind, position = step_kind(at), step_position(at)
    if kind == MODEL and position is not None:
        if not (0 < position < end and isinstance(messages[position], AssistantMessage)):
            raise ValueError(f"the transcript has no model step {at!r} (no reply at {position})")
        return _Cut(position)
    if kind == TOOL and position is not None:
        call_id = at.split(":", 2)[2]
        reply = messages[position] if 0 <= position < end else None
        ids = [c.id for c in reply.tool_calls] if isinstance(reply, AssistantMessage) else []
        if call_id not in ids:
            raise ValueError(f"the transcript has no tool step {at!r} (no such call at {position})")
        before = frozenset(ids[: ids.index(call_id)])
        kept = position + 1
        while kept < end and isinstance(m := messages[kept], ToolMessage) and m.call_id in before:
            kept += 1
        return _Cut(kept, batch=position, calls=before)
    raise ValueError(
        "a fork starts at a transcript position, a model step (model:<n>) or a tool step "
        f"(tool:<n>:<call_id>), not {at!r}"
    )


class _Planner:
    """The writes that make the fork, from the recorded source and the cut."""

    def __init__(
        self,
        source: RecordedSession,
        cut: _Cut,
        session_id: str,
        agent: str,
        *,
        first_seq: int = 1,
        queued: bool = False,
    ) -> None:
        self.source = source
        self.first_seq = first_seq
        self.queued = queued
        self.cut = cut
        self.session_id = session_id
        self.agent = agent
        self.kept = source.messages[: cut.position]
        self.answered = _answered(self.kept)
        self.writes: list[Write] = []
        self.steps = 0
        self.events = 0

    def keeps(self, step_id: str, *, cut_turn: bool) -> bool:
        """Whether the fork keeps the step (of the turn cut at the fork point, or not)."""
        kind, position = step_kind(step_id), step_position(step_id)
        if kind == NOTE and position is not None:
            # A call's note goes where its call goes (kept, or cut to run again).
            return self.keeps(noted_call(step_id), cut_turn=cut_turn)
        if kind == TOOL and position is not None:
            call = step_id.split(":", 2)[2]
            if position >= self.cut.position:
                return False
            if self.cut.batch == position:
                return call in self.cut.calls
            return (position, call) in self.answered or self.cut.exact
        if position is not None:
            return position < self.cut.position
        return not (cut_turn and kind in (INPUT, TRACE))

    def plan(self) -> tuple[str, TurnStatus]:
        """Add every write; return the turn at the fork point and its status."""
        kept_ids = list(dict.fromkeys(m.turn_id for m in self.kept))
        by_id = {t.turn_id: t for t in self.source.turns}
        last = kept_ids[-1]
        later = {m.turn_id for m in self.source.messages[self.cut.position :]}
        status: TurnStatus = "running"
        whole: set[str] = set()
        by_kept = set(kept_ids)
        for turn_id in kept_ids:
            turn = by_id.get(turn_id, RecordedTurn(turn_id=turn_id, record=None))
            cut = turn_id == last and (
                turn_id in later or any(not self.keeps(s, cut_turn=False) for s in turn.steps)
            )
            status = self._turn(turn, cut=cut, is_last=turn_id == last)
            if not cut:
                whole.add(turn_id)
        if self.queued:  # turns submitted and not opened yet: they stay queued
            for turn in self.source.turns:
                if turn.turn_id not in by_kept and _queued(turn.record):
                    self._queued_turn(turn)
        self.writes += [AppendMessage(i, m) for i, m in enumerate(self.kept)]
        seq = self.first_seq
        for event in self.source.events:
            if event.turn_id in whole:
                moved = replace(event, session_id=self.session_id, seq=seq)
                self.writes.append(LogEvent(moved))
                seq += 1
        self.events = seq - self.first_seq
        return last, status

    def _queued_turn(self, turn: RecordedTurn) -> None:
        assert turn.record is not None
        record = replace(turn.record, session_id=self.session_id, agent=self.agent)
        self.writes.append(new_turn(record, owner=self.source.owner))
        for step_id, result in turn.steps.items():
            self.writes.append(PutStep(step_id, turn.turn_id, result))
            self.steps += 1

    def _turn(self, turn: RecordedTurn, *, cut: bool, is_last: bool) -> TurnStatus:
        record = turn.record or self._rebuilt(turn.turn_id, is_last=is_last)
        status: TurnStatus = "running" if cut else record.status
        if status == "queued":
            status = "running"  # it has messages: it opened
        running = replace(
            record,
            session_id=self.session_id,
            agent=self.agent,
            status="running",
            text=None,
            error=None,
            pending=None,
            finished_at=None,
            cancel_reason=None,
        )
        self.writes.append(new_turn(running, owner=self.source.owner))
        if status == "cancelled":
            self.writes.append(RequestCancel(turn.turn_id, record.cancel_reason or "requested"))
        if status != "running":
            self.writes.append(
                move(
                    running,
                    status,
                    text=record.text,
                    error=record.error,
                    pending=record.pending,
                    now=record.finished_at,
                )
            )
        for step_id, result in turn.steps.items():
            if self.keeps(step_id, cut_turn=cut):
                self.writes.append(PutStep(step_id, turn.turn_id, result))
                self.steps += 1
        return status

    def _rebuilt(self, turn_id: str, *, is_last: bool) -> TurnRecord:
        """A turn of an archived generation, whose record the seam does not read:
        completed with its answer if the kept transcript ends it with one; else, the
        last turn, running (carried on), and an earlier one failed."""
        own = [m for m in self.kept if m.turn_id == turn_id]
        opening = own[0] if isinstance(own[0], UserMessage | TriggerMessage) else None
        final = own[-1]
        answered = isinstance(final, AssistantMessage) and not final.tool_calls
        status: TurnStatus = "completed" if answered else "running" if is_last else "failed"
        return TurnRecord(
            session_id=self.session_id,
            turn_id=turn_id,
            agent=self.agent,
            status=status,
            opening=opening if opening is not None else UserMessage(text="", turn_id=turn_id),
            text=final.text if answered and isinstance(final, AssistantMessage) else None,
            error=None
            if status != "failed"
            else f"it ended without an answer in {self.source.source}",
        )


def _queued(record: TurnRecord | None) -> bool:
    return record is not None and record.status == "queued"


def plan_copy(
    source: RecordedSession,
    cut: _Cut,
    session_id: str,
    agent: str,
    *,
    first_seq: int = 1,
    queued: bool = False,
) -> tuple[list[Write], ForkResult]:
    """The writes that store ``source`` up to ``cut`` as session ``session_id`` (its
    events numbered from ``first_seq``; ``queued``: turns not opened yet too), and
    what they make."""
    planner = _Planner(source, cut, session_id, agent, first_seq=first_seq, queued=queued)
    turn_id, status = planner.plan()
    made = ForkResult(
        source=source.source,
        session_id=session_id,
        agent=agent,
        at=cut.position,
        turn_id=turn_id,
        status=status,
        turns=len({m.turn_id for m in planner.kept}),
        steps=planner.steps,
        events=planner.events,
    )
    return planner.writes, made


def _answered(messages: list[Message]) -> set[tuple[int, str]]:
    """Each tool result's ``(position of the reply that asked, call id)``: call ids
    are unique within one reply only."""
    found: set[tuple[int, str]] = set()
    reply = -1
    for i, m in enumerate(messages):
        if isinstance(m, AssistantMessage):
            reply = i
        elif isinstance(m, ToolMessage):
            found.add((reply, m.call_id))
    return found


async def fork_session(
    store: Store,
    session_id: str,
    *,
    at: int | str | None = None,
    new_session: str | None = None,
    generation: int | None = None,
    agent: str | None = None,
) -> ForkResult:
    """Fork ``session_id`` (its live generation, or archived ``generation``) at ``at``
    into ``new_session`` (default: a fresh id), whose agent is ``agent`` (default:
    the original's). The new session must not exist; the original is only read."""
    if new_session is not None and (not isinstance(new_session, str) or not new_session):
        raise ConfigurationError("new_session must be a non-empty string")
    target_id = new_session or f"{session_id}.fork-{uuid.uuid4().hex[:8]}"
    if target_id == session_id:
        raise ConfigurationError("a fork needs a session id of its own, not the original's")
    source = await read_recorded(store.session(session_id), generation)
    cut = fork_point(source.messages, at)
    name = agent or source.agent
    if name is None:
        raise ConfigurationError(f"session {session_id!r} has no agent; name one with agent=")
    target = store.session(target_id)
    await _refuse_existing(target)
    writes, made = plan_copy(source, cut, target_id, name)
    await target.commit(writes)
    return made


async def _refuse_existing(target: SessionStore) -> None:
    snap = await target.load(from_index=NO_MESSAGES)
    if snap.agent is not None or snap.erased is not None or await target.generations():
        raise ConfigurationError(
            f"session {target.session_id!r} already exists: a fork makes a new session"
        )
