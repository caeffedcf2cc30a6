"""``CrashingStore``: wraps a real store and kills the process at a chosen commit.

Fault injection happens at the seam, never inside the engine: the wrapper counts
commits across all sessions and sends itself ``SIGKILL`` just before or just after
commit number ``crash_at``, which is what a power cut or OOM kill looks like.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, TypeVar

from .._seams.store import SessionStore, Store, ToolStep
from .._values.events import TurnEvent
from .._values.messages import Message
from .._values.records import SessionInfo, SessionKey, SessionSnapshot, SessionStatus, TurnRecord
from .._values.writes import Write

T = TypeVar("T")


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _CountingSession:
    def __init__(self, owner: CrashingStore, inner: SessionStore) -> None:
        self._owner = owner
        self._inner = inner

    @property
    def session_id(self) -> str:
        return self._inner.session_id

    def writer(self) -> AbstractAsyncContextManager[None]:
        return self._inner.writer()

    async def load(self, turn_id: str | None = None, *, from_index: int = 0) -> SessionSnapshot:
        return await self._inner.load(turn_id, from_index=from_index)

    async def commit(self, writes: Sequence[Write]) -> None:
        self._before()
        await self._inner.commit(writes)
        self._after()

    async def run_tool(self, step: ToolStep[T]) -> T:
        self._before()
        result = await self._inner.run_tool(step)
        self._after()
        return result

    def _before(self) -> None:
        if self._owner.when == "before" and self._owner.commits + 1 == self._owner.crash_at:
            self._owner.on_crash()

    def _after(self) -> None:
        self._owner.commits += 1
        if self._owner.when == "after" and self._owner.commits == self._owner.crash_at:
            self._owner.on_crash()

    async def turn(self, turn_id: str) -> TurnRecord | None:
        return await self._inner.turn(turn_id)

    async def cancel_reason(self, turn_id: str) -> str | None:
        return await self._inner.cancel_reason(turn_id)

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        return await self._inner.events(turn_id=turn_id, after=after)

    async def status(self) -> SessionStatus:
        return await self._inner.status()

    async def unfinished(self) -> list[TurnRecord]:
        return await self._inner.unfinished()

    async def generations(self) -> list[int]:
        return await self._inner.generations()

    async def archived_messages(self, generation: int) -> list[Message]:
        return await self._inner.archived_messages(generation)


class CrashingStore:
    """``CrashingStore(SqliteStore(path), crash_at=3, when="after")`` dies right after
    the third successful commit. ``crash_at=None`` only counts (see ``commits``)."""

    def __init__(
        self,
        inner: Store,
        *,
        crash_at: int | None = None,
        when: Literal["before", "after"] = "before",
        on_crash: Callable[[], Any] = _kill,
    ) -> None:
        self.inner = inner
        self.crash_at = crash_at
        self.when = when
        self.on_crash = on_crash
        self.commits = 0

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    def session(self, session_id: str) -> _CountingSession:
        return _CountingSession(self, self.inner.session(session_id))

    async def session_page(
        self,
        *,
        agent: str | None = None,
        limit: int,
        after: SessionKey | None = None,
        owner: str | None = None,
    ) -> list[SessionInfo]:
        return await self.inner.session_page(agent=agent, limit=limit, after=after, owner=owner)

    async def unfinished_turns(self) -> list[TurnRecord]:
        return await self.inner.unfinished_turns()
