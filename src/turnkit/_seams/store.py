"""The ``SessionStore`` seam: the contract every storage backend meets.

A backend (``Store``) hands out one ``SessionStore`` per session. Every durable
change is a list of writes (``turnkit._values.writes``) that the engine makes and
the store applies in one transaction, all or none: ``commit(writes)``. A local
tool's step is ``run_tool(step)``: the store calls ``step(handle)`` where its
transaction lives (off the event loop, as the tool may block), so the tool's SQL
through ``handle`` and the step's writes commit together. See ``docs/stores.md``
for the full contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

from .._errors import FatalToolError
from .._values.budgets import Spend
from .._values.events import TurnEvent
from .._values.messages import Message
from .._values.records import (
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    SessionStatus,
    TurnRecord,
)
from .._values.writes import Write

T = TypeVar("T")

#: A transcript position past any session's end: ``load(turn_id, from_index=NO_MESSAGES)``
#: reads a turn's record and steps and the next event number, but no message.
NO_MESSAGES = 2**31 - 1  # the largest index every store takes (PostgreSQL: integer)


@runtime_checkable
class StoreHandle(Protocol):
    """What a local tool sees as ``ctx.store``.

    ``unwrap()`` returns the backend's own connection inside the open step
    transaction (``None`` where there is none). ``execute(sql, params)`` runs one
    statement in that transaction with ``?`` placeholders and returns the rows it
    produced (empty for writes). ``transient(exc)`` tells the engine whether an
    exception a local tool raised is the database failing for a passing reason.
    """

    def unwrap(self) -> Any: ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by a local tool, or the cause it wraps) is this
        backend's database failing for a passing reason (a lock timeout, a
        serialization failure, a lost connection) rather than the tool's own answer.
        The engine then fails the step without recording it, so a redelivery runs
        the tool again; any other exception becomes the tool's error result."""
        ...


#: A local tool's step, as ``run_tool`` runs it: called with the store's handle
#: inside the step's transaction, it runs the tool and returns what the caller gets
#: back and the writes that record the step, committed with the tool's own SQL.
ToolStep: TypeAlias = Callable[[StoreHandle], tuple[T, Sequence[Write]]]


@runtime_checkable
class SessionStore(Protocol):
    """One session's durable state. Methods are coroutines so a networked store never
    blocks the event loop; ``commit``'s ``work`` is synchronous and must not await."""

    @property
    def session_id(self) -> str: ...

    def writer(self) -> AbstractAsyncContextManager[None]:
        """Hold the session's single-writer lock for one delivery of a turn.

        While it is held no other delivery, in this process or (for a networked
        store) any other, runs a step of this session; a second one waits, and
        past the store's timeout fails with ``SessionBusyError``.
        """
        ...

    async def load(self, turn_id: str | None = None, *, from_index: int = 0) -> SessionSnapshot:
        """Read what a delivery needs. Only messages at positions ``>= from_index``
        are returned, so a caller that kept the transcript reads just what is new."""
        ...

    async def commit(self, writes: Sequence[Write]) -> None:
        """Apply ``writes`` in order, in one transaction: all of them or, if one is
        refused (a ``StoreError``), none."""
        ...

    async def run_tool(self, step: ToolStep[T]) -> T:
        """Run a local tool's step in one transaction and return what it returned.

        ``step(handle)`` is called once, off the event loop (the tool may block),
        with the handle the tool sees as ``ctx.store``; the writes it returns are
        applied in the same transaction as whatever the tool did through the handle,
        and committed. If ``step`` or a write raises, everything rolls back and the
        exception propagates unchanged (a store's own failure as ``StoreError``).
        """
        ...

    async def turn(self, turn_id: str) -> TurnRecord | None: ...

    async def cancel_reason(self, turn_id: str) -> str | None:
        """The cancellation recorded for the turn, by any process, if there is one.

        The engine asks at every step boundary of a running turn, so it must be
        cheap: a store may answer from a change signal it watches (a file's time,
        a notification) and read the turn only when that moved, as long as a
        cancellation committed before the call is seen within a bounded delay.
        """
        ...

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]: ...

    async def status(self) -> SessionStatus: ...

    async def unfinished(self) -> list[TurnRecord]:
        """This session's ``queued``, ``running`` and ``suspended`` turns, oldest first."""
        ...

    async def generations(self) -> list[int]:
        """The archived generations of this session, oldest first."""
        ...

    async def archived_messages(self, generation: int) -> list[Message]:
        """The transcript of an archived generation (empty if there is none)."""
        ...


@runtime_checkable
class Store(Protocol):
    """A storage backend: many sessions behind one connection or pool."""

    async def open(self) -> None:
        """Connect and bring the schema up to date. Called by ``Runtime.__aenter__``."""

    async def close(self) -> None: ...

    def session(self, session_id: str) -> SessionStore: ...

    async def session_page(
        self,
        *,
        agent: str | None = None,
        limit: int,
        after: SessionKey | None = None,
        owner: str | None = None,
    ) -> list[SessionInfo]:
        """At most ``limit`` sessions (of ``agent`` and owned by ``owner``, if given),
        most recently updated first (ties by id), strictly after the
        ``(updated_at, session_id)`` key ``after``: keyset paging that stays stable
        while sessions are added."""

    async def unfinished_turns(self) -> list[TurnRecord]:
        """Turns to run again after a restart, oldest first: ``running`` ones (a
        process died under them) and ``queued`` ones (submitted, never opened)."""


class NoHandle:
    """``ctx.store`` where no transaction is open: remote tools, and the memory store."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def unwrap(self) -> None:
        return None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # A deployment mistake the model cannot correct, so it fails the turn.
        raise FatalToolError(f"ctx.store.execute is unavailable: {self._reason}")

    def transient(self, exc: BaseException) -> bool:
        return False  # no database behind it


# -- reads made from the seam's own -------------------------------------------------
# What a store need not offer because the seam already answers it; the runtime, the
# server and the CLI read these through the functions below.


async def transcript(store: SessionStore) -> list[Message]:
    """The live generation's whole transcript."""
    return (await store.load(from_index=0)).messages


async def parked_turn(store: SessionStore) -> TurnRecord | None:
    """The session's ``suspended`` turn (the newest, should there be several), if any."""
    parked = [t for t in await store.unfinished() if t.status == "suspended"]
    return parked[-1] if parked else None


#: How many sessions ``all_sessions`` reads per page.
_PAGE = 500


async def all_sessions(store: Store) -> list[SessionInfo]:
    """Every session the store has seen, by id."""
    found: list[SessionInfo] = []
    after: SessionKey | None = None
    while True:
        page = await store.session_page(limit=_PAGE, after=after)
        found += page
        if len(page) < _PAGE:
            return sorted(found, key=lambda i: i.session_id)
        last = page[-1]
        after = (last.updated_at, last.session_id)


@runtime_checkable
class SessionSpend(Protocol):
    """A session store that keeps the usage ledger (``CountUsage`` writes), so budgets
    can be checked before a model step (docs/tenants.md). Every built-in store does."""

    async def spend(self, tenant: str) -> tuple[Spend, Spend]:
        """What this session spent on model calls, and what ``tenant`` did."""
        ...


@runtime_checkable
class UsageLedger(Protocol):
    """A store whose usage ledger can be read whole: what each tenant spent."""

    async def usage_by_tenant(self) -> dict[str, Spend]:
        """Every tenant's spend, by tenant (tenants that spent nothing are left out)."""
        ...
