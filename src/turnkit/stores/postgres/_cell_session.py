"""One session of a deployment over several cells: every call goes to the cell the
directory placed the session in.

The cell is looked up when a call is made (the directory caches it for a few
seconds), not when the object is made, so a long-lived session object follows its
tenant's move. A commit refused because the tenant moved away (the fence of the
cell it left) makes the next call read the directory again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar

from ..._errors import StoreError
from ..._seams.store import SessionStore, ToolStep
from ..._values.budgets import Spend
from ..._values.events import TurnEvent
from ..._values.messages import Message
from ..._values.records import SessionSnapshot, SessionStatus, TurnRecord
from ..._values.writes import Write
from ._cell_directory import Directory
from ._store import PostgresStore

T = TypeVar("T")


class CellSession:
    """A ``SessionStore`` that forwards to the session's cell (see the module)."""

    def __init__(
        self,
        session_id: str,
        directory: Directory,
        cell: Callable[[str | None], PostgresStore],
    ) -> None:
        self._sid = session_id
        self._directory = directory
        self._cell = cell

    @property
    def session_id(self) -> str:
        return self._sid

    async def _here(self) -> SessionStore:
        return self._cell(await self._directory.cell_of(self._sid)).session(self._sid)

    @asynccontextmanager
    async def _writer(self) -> AsyncIterator[None]:
        async with (await self._here()).writer():
            yield

    def writer(self) -> AbstractAsyncContextManager[None]:
        return self._writer()

    async def load(self, turn_id: str | None = None, *, from_index: int = 0) -> SessionSnapshot:
        return await (await self._here()).load(turn_id, from_index=from_index)

    async def commit(self, writes: Sequence[Write]) -> None:
        try:
            await (await self._here()).commit(writes)
        except StoreError:
            self._directory.forget(self._sid)  # the tenant may have moved: ask again
            raise

    async def run_tool(self, step: ToolStep[T]) -> T:
        try:
            return await (await self._here()).run_tool(step)
        except StoreError:
            self._directory.forget(self._sid)
            raise

    async def turn(self, turn_id: str) -> TurnRecord | None:
        return await (await self._here()).turn(turn_id)

    async def cancel_reason(self, turn_id: str) -> str | None:
        return await (await self._here()).cancel_reason(turn_id)

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        return await (await self._here()).events(turn_id=turn_id, after=after)

    async def status(self) -> SessionStatus:
        return await (await self._here()).status()

    async def unfinished(self) -> list[TurnRecord]:
        return await (await self._here()).unfinished()

    async def generations(self) -> list[int]:
        return await (await self._here()).generations()

    async def archived_messages(self, generation: int) -> list[Message]:
        return await (await self._here()).archived_messages(generation)

    async def spend(self, tenant: str) -> tuple[Spend, Spend]:
        cell = self._cell(await self._directory.cell_of(self._sid))
        return await cell.session(self._sid).spend(tenant)
