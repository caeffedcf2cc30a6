"""``Cells``: one deployment over several PostgreSQL databases, each its own primary.

A tenant lives in one cell; each session is placed in its tenant's cell when it
stores its first turn (the runtime says whose turn it is: ``PlacingStore``), and
the directory in the home cell remembers both (``_cell_directory``). ``Cells`` is a
``Store`` like ``PostgresStore``, so one ``Runtime``, its ``Worker`` and its HTTP
app serve every cell: session calls go to the session's cell, claims go round the
cells, and the lists an operator reads (sessions, parked turns, workers, usage)
are merged from all of them. Moving a tenant is ``_cell_move``'s job.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ..._errors import ConfigurationError
from ..._seams.queue import PendingReset, Serving
from ..._seams.relay import EventRelay, Relayed
from ..._seams.store import NO_MESSAGES
from ..._seams.worker_view import HeldSession, LiveWorker
from ..._values.budgets import Spend
from ..._values.events import TurnEvent
from ..._values.records import SessionInfo, SessionKey, TurnRecord
from ..._values.tenancy import UNCAPPED, Concurrency
from ._cell_directory import Directory, Placement, stable_hash
from ._cell_session import CellSession
from ._election import PgElection
from ._store import PostgresStore, SessionWriter

T = TypeVar("T")


class Cells:
    """Several ``PostgresStore`` cells as one store (docs/deploying.md, "Cells").

    ``cells`` names each cell's store (every process must name them alike);
    ``place`` picks a new tenant's cell from its name (default: a stable hash over
    the names, ``stable_hash``). ``home`` is the cell whose schema keeps the
    directory, the rate-limit log and the elections (default: the first named); a
    database that was the whole deployment before cells should be the home, so its
    sessions are found where they are. ``refresh`` is how many seconds a process
    trusts what it read of the directory before reading it again.
    """

    def __init__(
        self,
        cells: Mapping[str, PostgresStore],
        *,
        place: Placement | None = None,
        home: str | None = None,
        refresh: float = 5.0,
    ) -> None:
        if not cells:
            raise ConfigurationError("Cells needs at least one cell")
        for name, store in cells.items():
            if not isinstance(name, str) or not name or not name.isprintable():
                raise ConfigurationError(f"a cell's name must be a printable string, got {name!r}")
            if not isinstance(store, PostgresStore):
                raise ConfigurationError(
                    f"cell {name!r} must be a PostgresStore, got {type(store).__name__}"
                )
        self.cells: dict[str, PostgresStore] = dict(cells)
        self.home = home if home is not None else next(iter(self.cells))
        if self.home not in self.cells:
            raise ConfigurationError(f"home cell {self.home!r} is not one of {sorted(self.cells)}")
        if refresh <= 0:
            raise ConfigurationError(f"refresh must be a positive number of seconds, got {refresh}")
        self._place = place if place is not None else stable_hash(sorted(self.cells))
        self.directory = Directory(lambda: self.cells[self.home].async_pool, refresh)
        self._turn = 0  # which cell a claim asks first

    def _cell(self, name: str | None) -> PostgresStore:
        """A cell by name; a session never placed lives in the home cell."""
        return self.cells[name if name is not None else self.home]

    def placement(self, tenant: str) -> str:
        """Where the placement function puts a new ``tenant`` (checked)."""
        cell = self._place(tenant)
        if cell not in self.cells:
            raise ConfigurationError(
                f"the placement put tenant {tenant!r} in {cell!r}, which is not one of "
                f"the cells {sorted(self.cells)}"
            )
        return cell

    # -- the Store protocol ------------------------------------------------------

    async def open(self) -> None:
        await asyncio.gather(*(store.open() for store in self.cells.values()))

    async def close(self) -> None:
        await asyncio.gather(*(store.close() for store in self.cells.values()))

    def session(self, session_id: str) -> CellSession:
        return CellSession(session_id, self.directory, self._cell)

    async def place(self, session_id: str, tenant: str) -> None:
        """See ``PlacingStore``. A session the directory has never seen but the home
        cell holds (stored before cells) is recorded where it is."""
        if await self.directory.cell_of(session_id) is not None:
            return
        snap = await self.cells[self.home].session(session_id).load(from_index=NO_MESSAGES)
        if snap.agent is not None:
            await self.directory.adopt(session_id, tenant, self.home)
            return
        await self.directory.place(session_id, tenant, self.placement(tenant))

    async def session_page(
        self,
        *,
        agent: str | None = None,
        limit: int,
        after: SessionKey | None = None,
        owner: str | None = None,
    ) -> list[SessionInfo]:
        pages = await self._each(
            lambda s: s.session_page(agent=agent, limit=limit, after=after, owner=owner)
        )
        kept = await self._where_placed(pages, lambda i: i.session_id)
        merged = heapq.merge(*kept, key=lambda i: (-i.updated_at, i.session_id))
        return list(merged)[:limit]

    async def unfinished_turns(self) -> list[TurnRecord]:
        pages = await self._where_placed(
            await self._each(lambda s: s.unfinished_turns()), lambda t: t.session_id
        )
        return sorted((t for page in pages for t in page), key=lambda t: t.created_at)

    # -- reading every cell --------------------------------------------------------

    async def _each(self, read: Callable[[PostgresStore], Any]) -> list[Any]:
        """``read(cell)`` of every cell, in the cells' order."""
        return list(await asyncio.gather(*(read(store) for store in self.cells.values())))

    async def _where_placed(
        self, pages: Sequence[Sequence[T]], session_of: Callable[[T], str]
    ) -> list[list[T]]:
        """Each cell's rows less those of sessions placed in another cell (a move's
        copy, before its source is cleared)."""
        ids = {session_of(row) for page in pages for row in page}
        placed = await self.directory.cells_of(sorted(ids))
        names = list(self.cells)
        return [
            [row for row in page if placed.get(session_of(row), self.home) == names[n]]
            for n, page in enumerate(pages)
        ]

    # -- the TurnQueue protocol ------------------------------------------------

    async def claim(
        self,
        agents: Sequence[str],
        *,
        limit: int,
        skip: Collection[str] = (),
        serving: Serving | None = None,
        concurrency: Concurrency = UNCAPPED,
    ) -> list[TurnRecord | PendingReset]:
        """Claim from every cell, a fair share of ``limit`` each: the cells are asked
        in turn, starting one further each claim, each for its share of what is
        left, so a busy cell cannot take every slot while another has work; what a
        cell leaves of its share goes to the cells that filled theirs."""
        names = list(self.cells)
        start = self._turn % len(names)
        self._turn += 1
        hungry = names[start:] + names[:start]
        taken: list[TurnRecord | PendingReset] = []
        while hungry and len(taken) < limit:
            full = []
            for n, name in enumerate(hungry):
                share = -(-(limit - len(taken)) // (len(hungry) - n))  # ceiling division
                if share < 1:
                    break
                got = await self.cells[name].claim(
                    agents, limit=share, skip=skip, serving=serving, concurrency=concurrency
                )
                for item in got:
                    self.directory.saw(item.session_id, name)
                taken += got
                if len(got) == share:
                    full.append(name)
            hungry = full
        return taken

    def unclaim(self, session_id: str) -> None:
        cell = self.directory.known(session_id)
        for name, store in self.cells.items():
            if cell is None or name == cell:
                store.unclaim(session_id)

    async def wait_for_turns(self, timeout: float) -> None:
        waits = [asyncio.ensure_future(s.wait_for_turns(timeout)) for s in self.cells.values()]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*waits, return_exceptions=True)

    # -- the WorkerRegistry and WorkerView protocols ----------------------------

    async def worker_seen(self, own: Mapping[str, str], serves: Collection[str] | None) -> None:
        await self._each(lambda s: s.worker_seen(own, serves))

    async def worker_gone(self) -> None:
        await self._each(lambda s: s.worker_gone())

    async def unserved_turns(self) -> list[tuple[str, str, int]]:
        counts: dict[tuple[str, str], int] = {}
        for page in await self._each(lambda s: s.unserved_turns()):
            for agent, version, n in page:
                counts[(agent, version)] = counts.get((agent, version), 0) + n
        return [(a, v, n) for (a, v), n in sorted(counts.items())]

    async def live_workers(self) -> list[LiveWorker]:
        seen: dict[str, LiveWorker] = {}
        for page in await self._each(lambda s: s.live_workers()):
            for worker in page:
                if worker.holder not in seen or worker.seen_at > seen[worker.holder].seen_at:
                    seen[worker.holder] = worker
        return [seen[h] for h in sorted(seen)]

    async def held_sessions(self, *, limit: int) -> list[HeldSession]:
        pages = await self._each(lambda s: s.held_sessions(limit=limit))
        merged = sorted((h for page in pages for h in page), key=lambda h: h.since or 0.0)
        return merged[:limit]

    async def event_writers(self, session_id: str) -> dict[int, str]:
        return await self._cell(await self.directory.cell_of(session_id)).event_writers(session_id)

    async def writer_of(self, session_id: str) -> SessionWriter | None:
        return await self._cell(await self.directory.cell_of(session_id)).writer_of(session_id)

    # -- TimerStore, InboxStore, PrunableStore: merged, oldest first -------------

    async def due_turns(self, before: float, *, limit: int) -> list[TurnRecord]:
        pages = await self._each(lambda s: s.due_turns(before, limit=limit))
        key = lambda t: (t.wake_at or 0.0, t.session_id, t.turn_id)  # noqa: E731
        return list(heapq.merge(*pages, key=key))[:limit]

    async def next_wake(self) -> float | None:
        wakes = [w for w in await self._each(lambda s: s.next_wake()) if w is not None]
        return min(wakes, default=None)

    async def parked_turns(
        self, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[TurnRecord]:
        pages = await self._where_placed(
            await self._each(lambda s: s.parked_turns(limit=limit, after=after)),
            lambda t: t.session_id,
        )
        key = lambda t: (t.created_at, t.session_id, t.turn_id)  # noqa: E731
        return list(heapq.merge(*pages, key=key))[:limit]

    async def idle_sessions(
        self, before: float, *, limit: int, after: tuple[float, str] | None = None
    ) -> list[tuple[float, str]]:
        pages = await self._each(lambda s: s.idle_sessions(before, limit=limit, after=after))
        return list(heapq.merge(*pages))[:limit]

    async def old_generations(
        self, before: float, *, limit: int, after: tuple[float, str, int] | None = None
    ) -> list[tuple[float, str, int]]:
        pages = await self._each(lambda s: s.old_generations(before, limit=limit, after=after))
        return list(heapq.merge(*pages))[:limit]

    async def ended_turns(
        self, before: float, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[tuple[float, str, str]]:
        pages = await self._each(lambda s: s.ended_turns(before, limit=limit, after=after))
        return list(heapq.merge(*pages))[:limit]

    # -- what the home cell keeps for every cell ----------------------------------

    async def rate_take(
        self,
        key: str,
        requests: int | None,
        tokens: int | None,
        window: float,
        slack: float,
        stale: float,
    ) -> tuple[float, int | None]:
        home = self.cells[self.home]
        return await home.rate_take(key, requests, tokens, window, slack, stale)

    async def rate_done(self, key: str, ticket: int, tokens: int) -> None:
        await self.cells[self.home].rate_done(key, ticket, tokens)

    async def rate_block(self, key: str, until: float) -> None:
        await self.cells[self.home].rate_block(key, until)

    def election(self, name: str, *, interval: float = 1.0) -> PgElection:
        return self.cells[self.home].election(name, interval=interval)

    @property
    def relay(self) -> EventRelay | None:
        relays = {n: s.relay for n, s in self.cells.items() if s.relay is not None}
        return _CellsRelay(relays, self.directory) if relays else None

    # -- sums over the cells ---------------------------------------------------

    async def usage_by_tenant(self) -> dict[str, Spend]:
        total: dict[str, Spend] = {}
        for page in await self._each(lambda s: s.usage_by_tenant()):
            for tenant, spend in page.items():
                total[tenant] = total[tenant] + spend if tenant in total else spend
        return dict(sorted(total.items()))

    async def turn_counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for page in await self._each(lambda s: s.turn_counts()):
            for status, n in page.items():
                total[status] = total.get(status, 0) + n
        return total

    async def sessions_of_tenant(self, tenant: str, session_ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for page in await self._each(lambda s: s.sessions_of_tenant(tenant, session_ids)):
            found |= page
        return found


class _CellsRelay:
    """The cells' relays as one: an event goes out on its session's cell (on every
    cell when this process has not looked the session up: a relay carries hints
    only), and a follower listens on every cell."""

    def __init__(self, relays: Mapping[str, EventRelay], directory: Directory) -> None:
        self._relays = dict(relays)
        self._directory = directory

    def publish(self, event: TurnEvent) -> None:
        cell = self._directory.known(event.session_id)
        for relay in self._on(cell):
            relay.publish(event)

    def follow(self, session_id: str, callback: Callable[[Relayed], None]) -> Callable[[], None]:
        stops = [relay.follow(session_id, callback) for relay in self._on(None)]

        def stop() -> None:
            for one in stops:
                one()

        return stop

    def _on(self, cell: str | None) -> Iterable[EventRelay]:
        if cell is not None and cell in self._relays:
            return (self._relays[cell],)
        return self._relays.values()
