"""The store conformance suite: the seam's contract as pytest tests, for any ``Store``.

turnkit runs it on ``MemoryStore``, ``SqliteStore`` and ``PostgresStore``; a
third-party backend runs the very same tests by importing them into one of its
test modules and providing one fixture::

    import pytest
    from turnkit.testing.conformance import *  # noqa: F403 - the suite's tests
    from turnkit.testing.conformance import StoreUnderTest

    @pytest.fixture
    def conformance_store(tmp_path):
        return StoreUnderTest(factory=lambda: MyStore(tmp_path / "db"))

``factory()`` must return a new, unopened store object over the *same* data each
time it is called, the way a new process would see it. Every store rolls a failed
commit back. Set ``sql=False`` for a backend that, by design, lacks a SQL handle:
the suite then checks that it lacks one honestly (``unwrap()`` is ``None`` and
``execute`` raises ``FatalToolError``). SQL handles are driven with ``?``
placeholders and portable SQL. Needs pytest and pytest-asyncio.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest

from .._engine.agent import Agent
from .._engine.context import ToolContext
from .._engine.tools import tool
from .._errors import (
    FatalToolError,
    GenerationArchivedError,
    SessionOwnerError,
    StoreError,
    TurnMoveError,
    WriteConflictError,
)
from .._runtime.runtime import Runtime
from .._seams.inbox import InboxStore
from .._seams.retention import PrunableStore
from .._seams.store import (
    SessionStore,
    Store,
    StoreHandle,
    all_sessions,
    parked_turn,
    transcript,
)
from .._values import turn_rules
from .._values.checkpoints import SuspendCheckpoint
from .._values.events import TurnCompletedEvent, TurnStartedEvent
from .._values.inbound import InboundEvent, User
from .._values.inputs import InputRequest
from .._values.messages import (
    AssistantMessage,
    Message,
    ToolMessage,
    TriggerMessage,
    UserMessage,
)
from .._values.policy import TurnPolicy
from .._values.records import PREVIEW_CHARS, TurnRecord, TurnStatus
from .._values.step_results import NO_STEPS, StepResults
from .._values.writes import (
    AppendMessage,
    ArchiveGeneration,
    DropGeneration,
    DropReset,
    EraseSession,
    LogEvent,
    PruneSession,
    PutStep,
    PutTurn,
    RequestCancel,
    RequestReset,
    TrimEvents,
    Write,
)
from ..models import ScriptedModel, ScriptedReply, tool_call
from ._crashing import CrashingStore

__all__ = [
    "StoreUnderTest",
    "test_conformance_a_crash_at_any_commit_is_recovered_by_redelivery",
    "test_conformance_a_failed_commit_reraises_unchanged",
    "test_conformance_a_failed_commit_undoes_every_kind_of_write",
    "test_conformance_a_reset_request_is_a_barrier_in_the_store",
    "test_conformance_a_taken_position_or_step_is_refused",
    "test_conformance_a_tool_step_runs_off_the_event_loop",
    "test_conformance_a_turn_moved_by_someone_else_first_is_refused",
    "test_conformance_a_turn_of_another_owner_is_refused",
    "test_conformance_an_empty_commit_changes_nothing",
    "test_conformance_commit_writes_read_back",
    "test_conformance_data_survives_reopening",
    "test_conformance_erasure_leaves_only_a_tombstone",
    "test_conformance_events_filter_by_turn_and_sequence",
    "test_conformance_load_from_an_index_reads_only_the_rest",
    "test_conformance_local_tool_rows_commit_or_roll_back_with_the_step",
    "test_conformance_park_cancel_and_unfinished",
    "test_conformance_queued_turns_open_or_settle",
    "test_conformance_reset_archives_a_generation",
    "test_conformance_retention_drops_only_what_aged_out",
    "test_conformance_run_tool_calls_its_step_once_and_commits_its_writes",
    "test_conformance_run_tool_writes_land_with_the_tools_sql",
    "test_conformance_session_pages_newest_first_by_key",
    "test_conformance_sessions_are_isolated_and_listed",
    "test_conformance_sessions_carry_a_preview_of_their_first_message",
    "test_conformance_sessions_record_their_owner",
    "test_conformance_sql_handle_or_its_honest_absence",
    "test_conformance_the_inbox_lists_parked_turns_page_by_page",
    "test_conformance_the_store_keeps_one_identity",
    "test_conformance_trimming_keeps_an_ended_turns_last_event",
    "test_conformance_turn_with_tools_checkpoints_and_replays",
    "test_conformance_unfinished_turns_oldest_first",
    "test_conformance_updating_a_missing_turn_is_refused",
    "test_conformance_writer_is_exclusive_per_session",
    "test_conformance_writes_apply_in_list_order",
]


@dataclass(frozen=True)
class StoreUnderTest:
    """A backend for the suite: how to make it, and what it offers by design."""

    factory: Callable[[], Store]
    #: A tool step's handle is a SQL connection: ``execute`` (with ``?``) joins the
    #: step's transaction.
    sql: bool = True


@asynccontextmanager
async def _opened(under: StoreUnderTest) -> AsyncIterator[Store]:
    store = under.factory()
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _record(
    session_id: str, turn_id: str, *, created_at: float = 1.0, agent: str = "a"
) -> TurnRecord:
    return TurnRecord(
        session_id=session_id,
        turn_id=turn_id,
        agent=agent,
        status="running",
        opening=UserMessage(text=f"open {turn_id}", turn_id=turn_id),
        created_at=created_at,
    )


async def _open_turn(
    session: SessionStore, turn_id: str, index: int = 0, owner: str | None = None, **kw: Any
) -> None:
    opening = UserMessage(text=f"open {turn_id}", turn_id=turn_id)

    record = _record(session.session_id, turn_id, **kw)
    await session.commit([AppendMessage(index, opening), turn_rules.new_turn(record, owner=owner)])


def _checkpoint(request_id: str, turn_id: str = "t1") -> SuspendCheckpoint:
    """A parked turn's checkpoint on one question, as a delivery parks it."""
    request = InputRequest(id=request_id, prompt="ok?", turn_id=turn_id, call_id="c1", tool="ask")
    return SuspendCheckpoint(
        request=request, call_id="c1", opening_text=f"open {turn_id}", event=None, policy=None
    )


def _move(turn_id: str, status: TurnStatus, *, was: TurnStatus = "running", **kw: Any) -> PutTurn:
    """The write that moves a stored turn (in status ``was``) to ``status``, made by
    the engine's rules, as a delivery makes it."""
    return turn_rules.move(replace(_record("s", turn_id), status=was), status, **kw)


def _queue(record: TurnRecord) -> PutTurn:
    """The write that stores ``record`` as a queued turn."""
    return turn_rules.new_turn(replace(record, status="queued"))


class _Boom(Exception):
    pass


def _read_rows(table: str, column: str) -> Callable[[StoreHandle], tuple[Any, list[Write]]]:
    """A tool step that reads ``column`` of an app table through the handle."""

    def read(handle: StoreHandle) -> tuple[Any, list[Write]]:
        return handle.execute(f"SELECT {column} FROM {table} ORDER BY {column}"), []

    return read


# -- the store seam ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_commit_writes_read_back(conformance_store: StoreUnderTest) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        assert await session.status() == "new"
        assert await transcript(session) == []
        await _open_turn(session, "t1")
        assert await session.status() == "running"
        reply = AssistantMessage(text="hi", turn_id="t1")
        started = TurnStartedEvent(turn_id="t1", session_id="s1", text="open t1", seq=1)
        done = TurnCompletedEvent(turn_id="t1", session_id="s1", text="hi", seq=2)

        await session.commit(
            [
                PutStep("model:1", "t1", {"text": "hi", "nested": [1, {"a": None}]}),
                AppendMessage(1, reply),
                LogEvent(started),
                LogEvent(done),
                _move("t1", "completed", text="hi"),
            ]
        )
        snap = await session.load("t1")
        assert snap.messages == [UserMessage(text="open t1", turn_id="t1"), reply]
        assert snap.steps == StepResults({"model:1": {"text": "hi", "nested": [1, {"a": None}]}})
        assert snap.turn is not None and snap.turn.status == "completed"
        assert snap.turn.text == "hi" and snap.turn.agent == "a"
        assert snap.agent == "a" and snap.next_seq == 3
        assert await session.events() == [started, done]
        assert await session.status() == "idle"
        record = await session.turn("t1")
        assert record is not None and record.finished_at is not None
        assert await session.turn("missing") is None


@pytest.mark.asyncio
async def test_conformance_a_failed_commit_reraises_unchanged(
    conformance_store: StoreUnderTest,
) -> None:
    """What a local tool's step raises comes out of ``run_tool`` as that very object,
    and nothing of the step lands."""
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")
        boom = _Boom("from the step")

        def step(handle: StoreHandle) -> tuple[None, list[Write]]:
            raise boom

        with pytest.raises(_Boom) as caught:
            await session.run_tool(step)
        assert caught.value is boom  # the engine tells tool failures apart by type
        snap = await session.load("t1")
        assert len(snap.messages) == 1 and snap.steps == NO_STEPS


@pytest.mark.asyncio
async def test_conformance_a_failed_commit_undoes_every_kind_of_write(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")
        started = TurnStartedEvent(turn_id="t1", session_id="s1", text="open t1", seq=1)
        await session.commit([LogEvent(started)])
        before = await session.load("t1")
        # Each list ends with a write the store must refuse (a taken position), so
        # every write before it has to be undone.
        refused = AppendMessage(0, UserMessage(text="again", turn_id="t1"))
        everything: list[Write] = [
            PutStep("model:1", "t1", {"text": "x"}),
            AppendMessage(1, AssistantMessage(text="x", turn_id="t1")),
            LogEvent(TurnCompletedEvent(turn_id="t1", session_id="s1", text="x", seq=2)),
            RequestCancel("t1", "requested"),
            _move("t1", "suspended", pending=_checkpoint("ok")),
            AppendMessage(2, UserMessage(text="open t2", turn_id="t2")),
            turn_rules.new_turn(_record("s1", "t2", created_at=2.0)),
            _queue(_record("s1", "t4", created_at=3.0)),
            RequestReset(),
            refused,
        ]
        reset: list[Write] = [
            ArchiveGeneration(0, "a"),
            EraseSession("someone"),
            AppendMessage(0, UserMessage(text="open t3", turn_id="t3")),
            AppendMessage(0, UserMessage(text="again", turn_id="t3")),
        ]
        for writes in (everything, reset):
            with pytest.raises(StoreError):
                await session.commit(writes)
            assert await session.load("t1") == before
            assert await session.status() == "running"
            assert await session.events() == [started]
            assert await parked_turn(session) is None and await session.turn("t2") is None
            assert [t.turn_id for t in await session.unfinished()] == ["t1"]
            assert await session.generations() == []


@pytest.mark.asyncio
async def test_conformance_an_empty_commit_changes_nothing(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await session.commit([])
        assert await session.status() == "new" and await all_sessions(store) == []
        await _open_turn(session, "t1")
        before = await session.load("t1")
        await session.commit([])
        assert await session.load("t1") == before


@pytest.mark.asyncio
async def test_conformance_writes_apply_in_list_order(conformance_store: StoreUnderTest) -> None:
    """A write may rely on one earlier in the same list: open a turn, then end it."""
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        opening = UserMessage(text="open t1", turn_id="t1")
        await session.commit(
            [
                AppendMessage(0, opening),
                turn_rules.new_turn(_record("s1", "t1")),
                RequestCancel("t1", "requested"),
                _move("t1", "cancelled"),
                AppendMessage(1, AssistantMessage(text="after", turn_id="t1")),
            ]
        )
        record = await session.turn("t1")
        assert record is not None and (record.status, record.cancel_reason) == (
            "cancelled",
            "requested",
        )
        assert await session.status() == "idle"
        assert [m.turn_id for m in await transcript(session)] == ["t1", "t1"]


@pytest.mark.asyncio
async def test_conformance_run_tool_calls_its_step_once_and_commits_its_writes(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")
        calls: list[bool] = []

        def step(handle: StoreHandle) -> tuple[dict[str, int], list[Write]]:
            calls.append(_loop_running())
            reply = AssistantMessage(text="from the step", turn_id="t1")
            return {"n": 1}, [PutStep("tool:0:c1", "t1", {"ok": True}), AppendMessage(1, reply)]

        assert await session.run_tool(step) == {"n": 1}
        assert calls == [False]  # once, and off the event loop
        snap = await session.load("t1")
        assert snap.steps == StepResults({"tool:0:c1": {"ok": True}}) and len(snap.messages) == 2

        def refused(handle: StoreHandle) -> tuple[None, list[Write]]:
            # Its writes are refused (a taken position): none of them lands.
            return None, [
                PutStep("tool:0:c2", "t1", {}),
                AppendMessage(1, UserMessage(text="x", turn_id="t1")),
            ]

        with pytest.raises(StoreError):
            await session.run_tool(refused)
        assert await session.load("t1") == snap


@pytest.mark.asyncio
async def test_conformance_run_tool_writes_land_with_the_tools_sql(
    conformance_store: StoreUnderTest,
) -> None:
    """What a step did through the handle and the writes it returned commit together,
    or (a write refused) not at all."""
    if not conformance_store.sql:
        pytest.skip("this backend has no SQL handle by design (checked above)")
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")

        def create(handle: StoreHandle) -> tuple[None, list[Write]]:
            handle.execute("CREATE TABLE conformance_paired (n INTEGER)")
            return None, []

        await session.run_tool(create)

        def insert(n: int, at: int) -> Callable[[StoreHandle], tuple[None, list[Write]]]:
            def step(handle: StoreHandle) -> tuple[None, list[Write]]:
                handle.execute("INSERT INTO conformance_paired (n) VALUES (?)", (n,))
                reply = AssistantMessage(text=f"wrote {n}", turn_id="t1")
                return None, [PutStep(f"tool:{n}", "t1", {"n": n}), AppendMessage(at, reply)]

            return step

        await session.run_tool(insert(1, 1))
        with pytest.raises(StoreError):
            await session.run_tool(insert(2, 1))  # position 1 is taken: all of it undone
        rows = await session.run_tool(_read_rows("conformance_paired", "n"))
        assert rows == [(1,)]
        assert (await session.load("t1")).steps == StepResults({"tool:1": {"n": 1}})


@pytest.mark.asyncio
async def test_conformance_a_taken_position_or_step_is_refused(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")

        taken_position = [AppendMessage(0, UserMessage(text="again", turn_id="t1"))]
        repeated_step = [
            PutStep("model:1", "t1", {"text": "first"}),
            PutStep("model:1", "t1", {"text": "second"}),
        ]
        with pytest.raises(WriteConflictError):
            await session.commit(taken_position)
        with pytest.raises(WriteConflictError):
            await session.commit(repeated_step)
        snap = await session.load("t1")
        assert snap.messages == [UserMessage(text="open t1", turn_id="t1")]
        assert snap.steps == NO_STEPS


@pytest.mark.asyncio
async def test_conformance_a_row_that_cannot_be_stored_refuses_its_whole_commit(
    conformance_store: StoreUnderTest,
) -> None:
    """A step's rows land together or not at all, also when the last one is what the
    store cannot encode; the refusal names it."""
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")
        before = await session.load("t1")
        rows: list[Write] = [
            PutStep("model:1", "t1", {"text": "x"}),
            AppendMessage(1, AssistantMessage(text="x", turn_id="t1")),
            LogEvent(TurnCompletedEvent(turn_id="t1", session_id="s1", text="x", seq=1)),
            PutStep("tool:1:c1", "t1", {"value": object()}),
        ]
        with pytest.raises(StoreError, match="tool:1:c1"):
            await session.commit(rows)
        assert await session.load("t1") == before
        assert await session.events() == []


@pytest.mark.asyncio
async def test_conformance_updating_a_missing_turn_is_refused(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        with pytest.raises(TurnMoveError, match="ghost"):
            await session.commit([_move("ghost", "completed", text="x")])
        assert await session.status() == "new"


@pytest.mark.asyncio
async def test_conformance_a_turn_moved_by_someone_else_first_is_refused(
    conformance_store: StoreUnderTest,
) -> None:
    """A ``PutTurn`` applies only if the turn is still in the status it was planned
    from: of two moves planned from ``running``, the second is refused whole."""
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")
        await session.commit([_move("t1", "completed", text="first")])
        late: list[Write] = [
            PutStep("model:9", "t1", {"text": "late"}),
            AppendMessage(1, AssistantMessage(text="late", turn_id="t1")),
            _move("t1", "failed", error="second"),
        ]
        with pytest.raises(TurnMoveError, match="from running to failed"):
            await session.commit(late)
        snap = await session.load("t1")
        assert snap.turn is not None and (snap.turn.status, snap.turn.text) == (
            "completed",
            "first",
        )
        assert len(snap.messages) == 1 and snap.steps == NO_STEPS
        assert await session.status() == "idle"


@pytest.mark.asyncio
async def test_conformance_events_filter_by_turn_and_sequence(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        events = [
            TurnStartedEvent(turn_id=tid, session_id="s1", text=tid, seq=seq)
            for seq, tid in enumerate(["t1", "t2", "t1", "t2"], start=1)
        ]

        await session.commit([LogEvent(event) for event in events])
        assert await session.events() == events
        assert await session.events(turn_id="t1") == [events[0], events[2]]
        assert await session.events(after=2) == events[2:]
        assert await session.events(turn_id="t2", after=2) == [events[3]]
        assert (await session.load()).next_seq == 5


@pytest.mark.asyncio
async def test_conformance_sessions_are_isolated_and_listed(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        one, two = store.session("s1"), store.session("s2")
        await _open_turn(one, "t1")
        await _open_turn(two, "t1")  # the same turn id in another session is another turn
        await one.commit([_move("t1", "completed", text="done")])
        assert await one.status() == "idle" and await two.status() == "running"
        assert len(await transcript(one)) == 1 and len(await transcript(two)) == 1
        listed = {(i.session_id, i.agent, i.status) for i in await all_sessions(store)}
        assert listed == {("s1", "a", "idle"), ("s2", "a", "running")}


@pytest.mark.asyncio
async def test_conformance_session_pages_newest_first_by_key(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        for n in range(7):
            session = store.session(f"s{n}")
            await _open_turn(session, "t1", agent="a" if n % 3 else "b")
        await store.session("s1").commit([_move("t1", "completed")])
        every = await all_sessions(store)
        expected = sorted(
            (i for i in every if i.agent == "a"), key=lambda i: (-i.updated_at, i.session_id)
        )
        assert expected[0].session_id == "s1"  # the last one updated comes first
        pages, after = [], None
        while True:
            page = await store.session_page(agent="a", limit=2, after=after)
            assert len(page) <= 2
            if not page:
                break
            pages.append(page)
            after = (page[-1].updated_at, page[-1].session_id)
        assert [i for page in pages for i in page] == expected
        everyone = await store.session_page(limit=100)
        assert sorted(i.session_id for i in everyone) == sorted(i.session_id for i in every)
        assert await store.session_page(agent="nobody", limit=5) == []


@pytest.mark.asyncio
async def test_conformance_sessions_carry_a_preview_of_their_first_message(
    conformance_store: StoreUnderTest,
) -> None:
    long = "Please  refund\norder 17 " + "ü" * 200

    def opened(session_id: str, opening: UserMessage | TriggerMessage) -> list[Write]:
        return [
            AppendMessage(0, opening),
            turn_rules.new_turn(_record(session_id, opening.turn_id)),
            AppendMessage(1, AssistantMessage(text="later text", turn_id=opening.turn_id)),
        ]

    async with _opened(conformance_store) as store:
        await store.session("long").commit(opened("long", UserMessage(text=long, turn_id="t1")))
        cron = TriggerMessage(text="nightly report", turn_id="t1", by="cron:daily")
        await store.session("cron").commit(opened("cron", cron))
        await _open_turn(store.session("reset"), "t1")
        await store.session("reset").commit([ArchiveGeneration(0, "a")])
        expected = {
            "long": "Please refund order 17 " + "ü" * (PREVIEW_CHARS - 24) + "…",
            "cron": "nightly report",
            "reset": None,  # the live generation has no message yet
        }
        for listing in (await all_sessions(store), await store.session_page(limit=10)):
            assert {i.session_id: i.preview for i in listing} == expected
        long_preview = expected["long"]
        assert long_preview is not None and len(long_preview) == PREVIEW_CHARS


@pytest.mark.asyncio
async def test_conformance_unfinished_turns_oldest_first(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        # Oldest by when the store took them, whatever time a record claims.
        await _open_turn(store.session("early"), "t1", created_at=20.0)
        await _open_turn(store.session("late"), "t2", created_at=10.0)
        await _open_turn(store.session("done"), "t3", created_at=5.0)
        await store.session("done").commit([_move("t3", "failed", error="x")])
        assert [t.turn_id for t in await store.unfinished_turns()] == ["t1", "t2"]


@pytest.mark.asyncio
async def test_conformance_data_survives_reopening(conformance_store: StoreUnderTest) -> None:
    async with _opened(conformance_store) as store:
        await _open_turn(store.session("s1"), "t1")
    async with _opened(conformance_store) as store:
        snap = await store.session("s1").load("t1")
        assert snap.turn is not None and snap.turn.status == "running"
        assert snap.messages == [UserMessage(text="open t1", turn_id="t1")]


@pytest.mark.asyncio
async def test_conformance_the_store_keeps_one_identity(conformance_store: StoreUnderTest) -> None:
    """``load().store_id`` is the same for every session and after reopening (a new
    process sees the same store), and not empty: idempotency keys include it."""
    async with _opened(conformance_store) as store:
        await _open_turn(store.session("s1"), "t1")
        first = (await store.session("s1").load("t1")).store_id
        assert isinstance(first, str) and first
        assert (await store.session("never-used").load()).store_id == first
    async with _opened(conformance_store) as store:
        assert (await store.session("s1").load()).store_id == first


@pytest.mark.asyncio
async def test_conformance_writer_is_exclusive_per_session(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        order: list[str] = []
        inside = asyncio.Event()
        leave = asyncio.Event()

        async def first() -> None:
            async with store.session("s1").writer():
                order.append("first in")
                inside.set()
                await leave.wait()
                order.append("first out")

        async def second() -> None:
            await inside.wait()
            async with store.session("s1").writer():
                order.append("second in")

        async def other_session() -> None:
            await inside.wait()
            async with store.session("s2").writer():
                order.append("other session in")
            leave.set()

        await asyncio.gather(first(), second(), other_session())
        assert order == ["first in", "other session in", "first out", "second in"]


@pytest.mark.asyncio
async def test_conformance_sql_handle_or_its_honest_absence(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        if not conformance_store.sql:

            def probe(handle: StoreHandle) -> tuple[None, list[Write]]:
                assert handle.unwrap() is None
                with pytest.raises(FatalToolError):
                    handle.execute("SELECT 1")
                assert handle.transient(ValueError("a tool's own")) is False
                return None, []

            await session.run_tool(probe)
            return

        def create(handle: StoreHandle) -> tuple[list[tuple[Any, ...]], list[Write]]:
            assert handle.unwrap() is not None
            assert handle.transient(ValueError("a tool's own")) is False
            handle.execute("CREATE TABLE conformance_rows (k TEXT PRIMARY KEY, v INTEGER)")
            handle.execute("INSERT INTO conformance_rows (k, v) VALUES (?, ?)", ("a", 1))
            return handle.execute("SELECT k, v FROM conformance_rows WHERE v = ?", (1,)), []

        assert await session.run_tool(create) == [("a", 1)]

        def write_then_fail(handle: StoreHandle) -> tuple[None, list[Write]]:
            handle.execute("INSERT INTO conformance_rows (k, v) VALUES (?, ?)", ("b", 2))
            raise _Boom("after the insert")

        with pytest.raises(_Boom):
            await session.run_tool(write_then_fail)
        assert await session.run_tool(_read_rows("conformance_rows", "k")) == [("a",)]


@pytest.mark.asyncio
async def test_conformance_load_from_an_index_reads_only_the_rest(
    conformance_store: StoreUnderTest,
) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")
        replies = [AssistantMessage(text=str(i), turn_id="t1") for i in range(1, 4)]

        await session.commit([AppendMessage(i, r) for i, r in enumerate(replies, start=1)])
        whole = await session.load("t1")
        rest = await session.load("t1", from_index=2)
        assert len(whole.messages) == 4 and whole.from_index == 0
        assert rest.messages == replies[1:] and rest.from_index == 2
        assert (await session.load("t1", from_index=4)).messages == []
        assert rest.turn == whole.turn and rest.next_seq == whole.next_seq


@pytest.mark.asyncio
async def test_conformance_park_cancel_and_unfinished(conformance_store: StoreUnderTest) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")
        assert [t.turn_id for t in await session.unfinished()] == ["t1"]
        assert await parked_turn(session) is None
        checkpoint = _checkpoint("ok")
        await session.commit([_move("t1", "suspended", pending=checkpoint)])
        parked = await parked_turn(session)
        assert parked is not None and parked.pending == checkpoint
        assert await session.status() == "suspended"
        assert [t.status for t in await session.unfinished()] == ["suspended"]
        await session.commit([RequestCancel("t1", "requested")])
        await session.commit([RequestCancel("t1", "reset")])  # first one wins
        await session.commit([_move("t1", "cancelled", was="suspended")])
        record = await session.turn("t1")
        assert record is not None and record.status == "cancelled"
        assert record.cancel_reason == "requested" and record.pending is None
        assert await parked_turn(session) is None and await session.unfinished() == []
        assert await session.status() == "idle"
        with pytest.raises(StoreError, match="no turn"):
            await session.commit([RequestCancel("ghost", "requested")])


@pytest.mark.asyncio
async def test_conformance_a_turns_payloads_read_back_as_stored(
    conformance_store: StoreUnderTest,
) -> None:
    """A turn's opening, inbound event and suspend checkpoint come back from every
    read as the values stored: a trigger's opening keeps who triggered it, the event
    its user, the checkpoint every open question, its deadlines and policy."""
    async with _opened(conformance_store) as store:
        session = store.session("p")
        opening = TriggerMessage(text="nightly run", turn_id="t1", by="cron")
        event = InboundEvent(source="slack", text="nightly run", user=User(id="u1"), kind="cron")
        record = replace(_record("p", "t1"), opening=opening, event=event)
        await session.commit([_queue(record)])
        queued = await session.turn("t1")
        assert queued is not None and (queued.opening, queued.event) == (opening, event)
        await session.commit([AppendMessage(0, opening), _move("t1", "running", was="queued")])
        asked = [
            InputRequest(
                id=f"q{n}",
                prompt=f"question {n}?",
                turn_id="t1",
                call_id=f"c{n}",
                tool="ask",
                schema={"type": "string"},
                expires_at=2_000_000_000.0 + n,
            )
            for n in (1, 2)
        ]
        checkpoint = SuspendCheckpoint(
            request=asked[0],
            call_id="c1",
            opening_text="nightly run",
            event=event,
            policy=TurnPolicy(source="slack", system="be brief", deny_tools=frozenset({"rm"})),
            generation=0,
            requests=tuple(asked),
        )
        await session.commit([_move("t1", "suspended", pending=checkpoint)])
        reads = [
            await session.turn("t1"),
            (await session.load("t1")).turn,
            *(await session.unfinished()),
        ]
        for read in reads:
            assert read is not None and read.status == "suspended"
            assert (read.opening, read.event, read.pending) == (opening, event, checkpoint)
            assert read.wake_at == 2_000_000_001.0  # the first deadline
    async with _opened(conformance_store) as store:  # and after reopening
        kept = await store.session("p").turn("t1")
        assert kept is not None and (kept.opening, kept.pending) == (opening, checkpoint)


@pytest.mark.asyncio
async def test_conformance_queued_turns_open_or_settle(conformance_store: StoreUnderTest) -> None:
    async with _opened(conformance_store) as store:
        session = store.session("q")
        # The store orders turns, never the record's clock: these claim ever earlier
        # times, yet sort in the order they were stored.
        await session.commit([_queue(_record("q", "t1", created_at=30.0))])
        await session.commit([_queue(_record("q", "t2", created_at=20.0))])
        await session.commit([_queue(_record("q", "t3", created_at=10.0))])
        queued = await session.turn("t1")
        assert queued is not None and queued.status == "queued"
        assert queued.opening == UserMessage(text="open t1", turn_id="t1")
        # A queued turn is stored and listed, but nothing is in the transcript yet.
        assert await session.status() == "new" and await transcript(session) == []
        assert [i.session_id for i in await all_sessions(store)] == ["q"]
        assert [t.turn_id for t in await session.unfinished()] == ["t1", "t2", "t3"]
        assert [t.turn_id for t in await store.unfinished_turns()] == ["t1", "t2", "t3"]
        with pytest.raises(StoreError):
            await session.commit([_queue(_record("q", "t1"))])

        first = await session.turn("t1")
        assert first is not None
        opening = UserMessage(text="open t1", turn_id="t1")
        await session.commit([AppendMessage(0, opening), _move("t1", "running", was="queued")])
        opened = await session.turn("t1")
        assert opened is not None and opened.status == "running"
        assert opened.created_at == first.created_at and await session.status() == "running"
        with pytest.raises(TurnMoveError, match="t1"):  # a running turn is not opened twice
            await session.commit([turn_rules.new_turn(_record("q", "t1"))])
        with pytest.raises(TurnMoveError, match="t1"):  # nor moved from queued again
            await session.commit([_move("t1", "running", was="queued")])

        await session.commit([RequestCancel("t2", "replaced")])
        await session.commit(
            [RequestCancel("t2", "requested"), _move("t2", "cancelled", was="queued")]
        )
        await session.commit([_move("t3", "failed", was="queued", error="parked")])
        t2, t3 = await session.turn("t2"), await session.turn("t3")
        assert t2 is not None and (t2.status, t2.cancel_reason) == ("cancelled", "replaced")
        assert t3 is not None and (t3.status, t3.error) == ("failed", "parked")
        assert t3.finished_at is not None
        assert await session.status() == "running"  # settling leaves the session alone
        assert [t.turn_id for t in await session.unfinished()] == ["t1"]
        for turn_id in ("t1", "t2", "ghost"):  # only a queued turn settles from queued
            with pytest.raises(TurnMoveError, match=turn_id):
                await session.commit([_move(turn_id, "cancelled", was="queued")])


@pytest.mark.asyncio
async def test_conformance_reset_archives_a_generation(conformance_store: StoreUnderTest) -> None:
    async with _opened(conformance_store) as store:
        session, other = store.session("s1"), store.session("s2")
        await _open_turn(session, "t1")
        await _open_turn(other, "t1")
        started = TurnStartedEvent(turn_id="t1", session_id="s1", text="open t1", seq=1)

        await session.commit([PutStep("model:1", "t1", {"text": "x"}), LogEvent(started)])
        assert (await session.load()).generation == 0
        await session.commit([ArchiveGeneration(0, "a")])
        snap = await session.load("t1")
        assert snap.messages == [] and snap.steps == NO_STEPS and snap.turn is None
        # Event numbers carry on across a reset: an id a client kept from generation
        # 0 never names an event of generation 1.
        assert snap.generation == 1 and snap.next_seq == 2
        assert await session.events() == [] and await session.status() == "new"
        assert await session.generations() == [0]
        assert await session.archived_messages(0) == [UserMessage(text="open t1", turn_id="t1")]
        assert await session.archived_messages(7) == []
        with pytest.raises(GenerationArchivedError):  # generation 0 is gone already
            await session.commit([ArchiveGeneration(0, "a")])
        assert len(await transcript(other)) == 1  # other sessions are untouched
        await _open_turn(session, "t2")  # the same address lives on
        assert [m.turn_id for m in await transcript(session)] == ["t2"]
        await session.commit([ArchiveGeneration(1, "a")])  # logged nothing
        assert (await session.load()).next_seq == 2
        await _open_turn(session, "t3")
        await session.commit(
            [LogEvent(TurnStartedEvent(turn_id="t3", session_id="s1", text="open t3", seq=2))]
        )
        assert [e.seq for e in await session.events()] == [2]
        await session.commit([ArchiveGeneration(2, "a")])
        assert (await session.load()).next_seq == 3


@pytest.mark.asyncio
async def test_conformance_erasure_leaves_only_a_tombstone(
    conformance_store: StoreUnderTest,
) -> None:
    """``EraseSession`` deletes the session's live and archived contents, queued turns
    included, and keeps its id, agent, owner, who and when, and its event numbering;
    other sessions are untouched, and the session takes turns again afterwards."""
    async with _opened(conformance_store) as store:
        session, other = store.session("s1"), store.session("s2")
        await session.commit([EraseSession("nobody")])  # never seen: nothing
        assert (await session.load()).erased is None and await all_sessions(store) == []

        await _open_turn(session, "t1", owner="alice")
        started = TurnStartedEvent(turn_id="t1", session_id="s1", text="open t1", seq=1)
        await session.commit([PutStep("model:1", "t1", {"text": "x"}), LogEvent(started)])
        await session.commit([ArchiveGeneration(0, "a")])  # generation 0, archived
        await _open_turn(session, "t2", owner="alice")
        done = TurnCompletedEvent(turn_id="t2", session_id="s1", text="y", seq=2)
        await session.commit(
            [
                PutStep("model:2", "t2", {"text": "y"}),
                LogEvent(done),
                _move("t2", "suspended", pending=_checkpoint("ok")),
            ]
        )
        await session.commit([_queue(_record("s1", "t3"))])
        await _open_turn(other, "t1")

        await session.commit([EraseSession("alice")])
        snap = await session.load("t2")
        assert (snap.messages, snap.steps, snap.turn) == ([], NO_STEPS, None)
        assert snap.erased is not None and snap.erased.by == "alice" and snap.erased.at > 0
        assert (snap.owner, snap.agent, snap.generation) == ("alice", "a", 2)
        assert snap.next_seq == 3  # numbering carries on after the erased events
        assert not snap.reset_requested and await session.status() == "new"
        assert await session.events() == [] and await session.generations() == []
        assert await session.archived_messages(0) == []
        assert await session.unfinished() == [] and await session.turn("t3") is None
        assert [t.session_id for t in await store.unfinished_turns()] == ["s2"]
        assert len(await transcript(other)) == 1  # other sessions are untouched

        await _open_turn(session, "t4", owner="alice")  # the address lives on
        assert [m.turn_id for m in await transcript(session)] == ["t4"]
        assert (await session.load()).erased is not None  # the tombstone stays
    async with _opened(conformance_store) as store:  # reopened: the tombstone lasts
        erased = (await store.session("s1").load()).erased
        assert erased is not None and erased.by == "alice"


@pytest.mark.asyncio
async def test_conformance_the_inbox_lists_parked_turns_page_by_page(
    conformance_store: StoreUnderTest,
) -> None:
    """An ``InboxStore`` (optional) lists the parked turns of every session ordered by
    ``(created_at, session_id, turn_id)``, each with its checkpoint, a page at a time
    after a key; a turn that goes on is listed no more."""
    async with _opened(conformance_store) as store:
        if not isinstance(store, InboxStore):
            return
        order = ["s2", "s3", "s1", "s4"]  # the store orders by when it took each turn
        for sid in order:
            await _open_turn(store.session(sid), "t1")
        await _open_turn(store.session("busy"), "t1")  # running: not listed
        for sid in order:
            pending = _checkpoint(sid)
            await store.session(sid).commit([_move("t1", "suspended", pending=pending)])
        rows = await store.parked_turns(limit=10)
        assert [r.session_id for r in rows] == order
        keys = [(r.created_at, r.session_id, r.turn_id) for r in rows]
        assert keys == sorted(keys)
        assert all(r.status == "suspended" for r in rows)
        assert [r.pending for r in rows] == [_checkpoint(sid) for sid in order]
        first = await store.parked_turns(limit=2)
        assert first + await store.parked_turns(limit=10, after=keys[1]) == rows
        assert await store.parked_turns(limit=10, after=keys[-1]) == []
        await store.session("s3").commit([_move("t1", "running", was="suspended")])
        assert [r.session_id for r in await store.parked_turns(limit=10)] == ["s2", "s1", "s4"]


@pytest.mark.asyncio
async def test_conformance_retention_drops_only_what_aged_out(
    conformance_store: StoreUnderTest,
) -> None:
    """``DropGeneration`` deletes one archived generation; ``PruneSession`` deletes an
    idle session whole and leaves alone one used since the cutoff, one with a turn
    queued, running or parked, and one with a reset pending. A ``PrunableStore``
    lists them oldest first, page by page."""
    async with _opened(conformance_store) as store:
        gone, parked, queued, fresh = (store.session(s) for s in ("gone", "parked", "q", "new"))
        for session in (gone, parked, fresh):
            await _open_turn(session, "t1")
            await session.commit([_move("t1", "completed", text="x")])
        await gone.commit([ArchiveGeneration(0, "a")])
        await _open_turn(gone, "t2")
        await gone.commit([_move("t2", "completed"), ArchiveGeneration(1, "a")])
        await _open_turn(parked, "t2", index=1)
        await parked.commit([_move("t2", "suspended", pending=_checkpoint("ok"))])
        await queued.commit([_queue(_record("q", "t1"))])
        cutoff = time.time() + 3600  # everything so far is older than this
        if isinstance(store, PrunableStore):
            idle = await store.idle_sessions(cutoff, limit=10)
            assert sorted(sid for _, sid in idle) == ["gone", "new"]
            first = await store.idle_sessions(cutoff, limit=1)
            rest = await store.idle_sessions(cutoff, limit=10, after=first[-1])
            assert first + rest == idle  # pages by key, oldest first
            old = await store.old_generations(cutoff, limit=10)
            assert [(sid, g) for _, sid, g in old] == [("gone", 0), ("gone", 1)]
            assert await store.old_generations(0.0, limit=10) == []
            assert await store.idle_sessions(0.0, limit=10) == []

        await gone.commit([DropGeneration(0), DropGeneration(7)])  # 7: never archived
        assert await gone.generations() == [1] and await gone.archived_messages(0) == []
        assert len(await gone.archived_messages(1)) == 1

        await gone.commit([PruneSession(0.0)])  # not idle for that long: kept
        assert (await gone.load()).agent == "a"
        await store.session("resetting").commit([PruneSession(cutoff)])  # never seen
        for session in (gone, parked, queued, fresh):
            await session.commit([PruneSession(cutoff)])
        assert (await gone.load()).agent is None and await gone.generations() == []
        assert await transcript(gone) == [] and await gone.turn("t2") is None
        assert (await fresh.load()).agent is None
        assert (await parked.load("t2")).turn is not None  # parked: kept
        assert (await queued.load("t1")).turn is not None  # queued: kept
        assert sorted(i.session_id for i in await all_sessions(store)) == ["parked", "q"]

        await _open_turn(fresh, "t9")  # a pruned id is free again: a new session
        snap = await fresh.load("t9")
        assert snap.generation == 0 and [m.turn_id for m in snap.messages] == ["t9"]
        await _open_turn(store.session("r"), "t1")
        await store.session("r").commit([_move("t1", "completed"), RequestReset()])
        await store.session("r").commit([PruneSession(cutoff)])  # a reset pending: kept
        assert (await store.session("r").load()).agent == "a"


@pytest.mark.asyncio
async def test_conformance_trimming_keeps_an_ended_turns_last_event(
    conformance_store: StoreUnderTest,
) -> None:
    """``TrimEvents`` cuts an ended turn's events to its last one, once (a
    ``PrunableStore`` lists it no more), and leaves a turn still running alone."""
    async with _opened(conformance_store) as store:
        session = store.session("s1")
        await _open_turn(session, "t1")
        started = TurnStartedEvent(turn_id="t1", session_id="s1", text="open t1", seq=1)
        done = TurnCompletedEvent(turn_id="t1", session_id="s1", text="x", seq=3)
        other = TurnStartedEvent(turn_id="t2", session_id="s1", text="open t2", seq=2)
        await session.commit([LogEvent(started), LogEvent(other), LogEvent(done)])
        await session.commit([_move("t1", "completed", text="x")])
        await _open_turn(session, "t2", index=1)
        later = TurnStartedEvent(turn_id="t2", session_id="s1", text="again", seq=4)
        await session.commit([LogEvent(later)])
        cutoff = time.time() + 3600
        if isinstance(store, PrunableStore):
            assert [tid for _, _, tid in await store.ended_turns(cutoff, limit=10)] == ["t1"]
            assert await store.ended_turns(0.0, limit=10) == []
        await session.commit([TrimEvents("t1"), TrimEvents("t2"), TrimEvents("ghost")])
        assert await session.events() == [other, done, later]  # t2 runs: all of it kept
        assert (await session.load()).next_seq == 5
        if isinstance(store, PrunableStore):
            assert await store.ended_turns(cutoff, limit=10) == []  # trimmed once


@pytest.mark.asyncio
async def test_conformance_a_reset_request_is_a_barrier_in_the_store(
    conformance_store: StoreUnderTest,
) -> None:
    """``request_reset`` marks the session and cancels the turns stored before it, in
    one write; turns stored after it are untouched and stay live through the
    archive, which clears the mark (as ``drop_reset`` does without archiving)."""
    async with _opened(conformance_store) as store:
        session = store.session("r")
        await session.commit([RequestReset()])  # no session yet: nothing
        assert not (await session.load()).reset_requested
        await _open_turn(session, "t1")
        await session.commit([_queue(_record("r", "t2", created_at=20.0))])
        await session.commit([RequestCancel("t2", "replaced")])
        await session.commit([_queue(_record("r", "t3", created_at=30.0))])
        assert not (await session.load()).reset_requested
        await session.commit([RequestReset()])
        await session.commit([RequestReset()])  # a second request: one mark
        await session.commit([_queue(_record("r", "t4", created_at=40.0))])
        assert (await session.load()).reset_requested
        reasons = {t.turn_id: t.cancel_reason for t in await session.unfinished()}
        # The first cancellation recorded stays; the turn stored after is untouched.
        assert reasons == {"t1": "reset", "t2": "replaced", "t3": "reset", "t4": None}
        with pytest.raises(StoreError):  # a failed commit leaves the mark as it was
            await session.commit([DropReset(), _move("t1", "cancelled", was="queued")])
        assert (await session.load()).reset_requested
        await session.commit(
            [
                _move("t1", "cancelled"),
                _move("t2", "cancelled", was="queued"),
                _move("t3", "cancelled", was="queued"),
                ArchiveGeneration(0, "a"),
            ]
        )
        snap = await session.load("t4")
        assert not snap.reset_requested and snap.generation == 1
        assert snap.turn is not None and snap.turn.status == "queued"
        assert [t.turn_id for t in await session.unfinished()] == ["t4"]
        await session.commit([RequestReset()])
        assert (await session.load()).reset_requested
        await session.commit([DropReset()])
        assert not (await session.load()).reset_requested
        assert await session.generations() == [0]


@pytest.mark.asyncio
async def test_conformance_sessions_record_their_owner(conformance_store: StoreUnderTest) -> None:
    """The turn that creates a session records its owner; later turns, resets and
    reopening keep it; the session list carries it and filters by it."""
    async with _opened(conformance_store) as store:
        mine, code = store.session("mine"), store.session("code")
        assert (await mine.load()).owner is None  # no session yet
        await _open_turn(mine, "t1", owner="alice")
        await _open_turn(code, "t1")  # opened from code: nobody's
        await _open_turn(store.session("bobs"), "t1", owner="bob", agent="b")
        await mine.commit([_move("t1", "completed")])
        await _open_turn(mine, "t2", index=1, owner="bob")  # an existing session keeps its owner
        assert (await mine.load("t2")).owner == "alice"
        assert (await code.load()).owner is None
        await mine.commit([ArchiveGeneration(0, "a")])
        await _open_turn(mine, "t3", owner="carol")
        assert (await mine.load()).owner == "alice"
    async with _opened(conformance_store) as store:
        assert (await store.session("mine").load()).owner == "alice"
        expected = {"mine": "alice", "code": None, "bobs": "bob"}
        for listing in (await all_sessions(store), await store.session_page(limit=10)):
            assert {i.session_id: i.owner for i in listing} == expected
        assert [i.session_id for i in await store.session_page(limit=10, owner="alice")] == ["mine"]
        assert [i.session_id for i in await store.session_page(limit=10, owner="bob")] == ["bobs"]
        assert await store.session_page(agent="a", limit=10, owner="bob") == []
        assert await store.session_page(limit=10, owner="nobody") == []


@pytest.mark.asyncio
async def test_conformance_a_turn_of_another_owner_is_refused(
    conformance_store: StoreUnderTest,
) -> None:
    """``start(owner=…)`` on a session another owner opened (or code opened) fails
    with ``SessionOwnerError`` and stores nothing; code (no owner) may use any."""
    async with Runtime(_order_agent([]), store=conformance_store.factory()) as rt:
        session = rt.session("a", "s1")
        assert await session.turn("order x", owner="alice") == "x is on its way"
        before = (await session.messages(), await session.events())
        for intruder in ("bob", "alice "):
            with pytest.raises(SessionOwnerError, match="not opened by"):
                await session.turn("order y", owner=intruder)
        assert (await session.messages(), await session.events()) == before
        code = rt.session("a", "s2")
        await code.turn("order z")
        with pytest.raises(SessionOwnerError):
            await code.turn("order z", owner="alice")  # nobody's is not alice's
        await session.turn("order w")  # code acts on alice's session
        assert await session.turn("order v", owner="alice") == "x is on its way"
        infos = {i.session_id: i.owner for i in await rt.sessions()}
        assert infos == {"s1": "alice", "s2": None}


# -- the engine on the store ---------------------------------------------------------


def _order_agent(counter: list[str]) -> Agent:
    @tool
    def place(item: str) -> str:
        """Places an order (local)."""
        counter.append(item)
        return f"placed {item}"

    @tool
    async def ship(item: str) -> str:
        """Ships it (remote)."""
        return f"shipped {item}"

    def respond(messages: Any) -> Any:
        done = [m for m in messages if isinstance(m, ToolMessage)]
        if not done or isinstance(messages[-1], UserMessage):
            return ScriptedReply(text="placing", tool_calls=[tool_call("place", {"item": "x"})])
        if len(done) == 1:
            return ScriptedReply(tool_calls=[tool_call("ship", {"item": "x"})])
        return "x is on its way"

    return Agent(name="a", model=ScriptedModel(respond=respond), tools=[place, ship])


def _roles(messages: list[Message]) -> list[str]:
    return [m.role for m in messages]


@pytest.mark.asyncio
async def test_conformance_turn_with_tools_checkpoints_and_replays(
    conformance_store: StoreUnderTest,
) -> None:
    placed: list[str] = []
    async with Runtime(_order_agent(placed), store=conformance_store.factory()) as rt:
        session = rt.session("a", "s1")
        tid = session.start("order x")
        assert (await session.result(tid)).text == "x is on its way"
        session.start("order x", turn_id=tid)  # a redelivery runs nothing again
        assert (await session.result(tid)).text == "x is on its way"
        messages = await session.messages()
    assert _roles(messages) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert placed == ["x"]
    async with Runtime(_order_agent(placed), store=conformance_store.factory()) as rt:
        assert await rt.session("a", "s1").messages() == messages
        assert await rt.session("a", "s1").status() == "idle"


@pytest.mark.asyncio
async def test_conformance_a_crash_at_any_commit_is_recovered_by_redelivery(
    conformance_store: StoreUnderTest,
) -> None:
    """Interrupt the delivery at every commit boundary (a store outage at the seam),
    then redeliver on a reopened store: the turn completes exactly as an
    uninterrupted one, and the local tool's work is recorded once."""

    class Outage(Exception):
        pass

    def outage() -> None:
        raise Outage("the store went away")

    # A reference run counts the commits of one turn.
    counting = CrashingStore(conformance_store.factory())
    async with Runtime(_order_agent([]), store=counting) as rt:
        await rt.session("a", "reference").turn("order x")
    commits = counting.commits
    assert commits >= 5
    for k in range(1, commits + 1):
        for when in ("before", "after"):
            sid = f"crash-{k}-{when}"
            placed: list[str] = []
            crashing = CrashingStore(
                conformance_store.factory(), crash_at=k, when=when, on_crash=outage
            )
            async with Runtime(_order_agent(placed), store=crashing) as rt:
                session = rt.session("a", sid)
                tid = session.start("order x")
                try:
                    await session.result(tid)
                except Exception as exc:
                    assert isinstance(exc, Outage), exc
            async with Runtime(_order_agent(placed), store=conformance_store.factory()) as rt:
                session = rt.session("a", sid)
                session.start("order x", turn_id=tid)
                result = await session.result(tid)
                messages = await session.messages()
            where = f"interrupted {when} commit {k}"
            assert result.text == "x is on its way", where
            assert _roles(messages) == [
                "user",
                "assistant",
                "tool",
                "assistant",
                "tool",
                "assistant",
            ], where
            # Only a kill after the tool ran but before its commit reruns it.
            assert 1 <= len(placed) <= 2, where
            assert not any(isinstance(m, ToolMessage) and m.is_error for m in messages), where


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.mark.asyncio
async def test_conformance_a_tool_step_runs_off_the_event_loop(
    conformance_store: StoreUnderTest,
) -> None:
    """A local tool's step (``run_tool``) may block: it runs off the event loop, and
    other sessions commit meanwhile. It is called once."""
    async with _opened(conformance_store) as store:
        blocked, other = store.session("s1"), store.session("s2")
        await _open_turn(blocked, "t1")
        await _open_turn(other, "t2")
        started, go = threading.Event(), threading.Event()
        loops: list[bool] = []

        def tool_step(handle: StoreHandle) -> tuple[str, list[Write]]:
            loops.append(_loop_running())
            started.set()
            # A safety net, not a timing: go is set once the other session committed.
            if not go.wait(timeout=60):
                raise _Boom("the other session never committed: the event loop was blocked")
            return "ran", [AppendMessage(1, AssistantMessage(text="after the tool", turn_id="t1"))]

        step = asyncio.ensure_future(blocked.run_tool(tool_step))
        while not started.is_set():
            await asyncio.sleep(0.001)
        meanwhile = AssistantMessage(text="meanwhile", turn_id="t2")
        await other.commit([AppendMessage(1, meanwhile)])
        go.set()
        assert await step == "ran" and loops == [False]
        assert (await transcript(blocked))[1] == AssistantMessage(
            text="after the tool", turn_id="t1"
        )
        assert (await transcript(other))[1] == meanwhile


@pytest.mark.asyncio
async def test_conformance_local_tool_rows_commit_or_roll_back_with_the_step(
    conformance_store: StoreUnderTest,
) -> None:
    if not conformance_store.sql:
        pytest.skip("this backend has no SQL handle by design (checked above)")

    @tool
    def record(n: int, ctx: ToolContext) -> str:
        """Writes an app row, failing for odd numbers after writing."""
        ctx.store.execute("CREATE TABLE IF NOT EXISTS conformance_app (n INTEGER)")
        ctx.store.execute("INSERT INTO conformance_app (n) VALUES (?)", (n,))
        if n % 2:
            raise ValueError(f"{n} is odd")
        return "ok"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(
                tool_calls=[tool_call("record", {"n": 2}), tool_call("record", {"n": 3})]
            )
        return "recorded"

    agent = Agent(name="a", model=ScriptedModel(respond=respond), tools=[record])
    async with Runtime(agent, store=conformance_store.factory()) as rt:
        assert await rt.session("a", "s1").turn("go") == "recorded"
        results = [m for m in await rt.session("a", "s1").messages() if m.role == "tool"]

        rows = await rt.store.session("check").run_tool(_read_rows("conformance_app", "n"))
    assert [getattr(m, "is_error", None) for m in results] == [False, True]
    assert rows == [(2,)]  # the failing call's row rolled back with its step
