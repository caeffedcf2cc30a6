"""``RuntimeClient``: a process's handle on turns that other processes run.

An HTTP node, a script or another service stores turns, answers, cancellations
and resets through it for the workers on the same store, and follows the turns
through the store; it runs none itself. ``Runtime`` is a ``RuntimeClient`` that
also runs them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from .._engine.agent import Agent
from .._errors import ConfigurationError
from .._seams.placing import PlacingStore
from .._seams.relay import EventRelay, RelayingStore
from .._seams.sink import EventSink, LocalEventSink
from .._seams.store import Store, all_sessions
from .._values.records import SessionInfo
from .._values.text import unstorable
from .approvals import GrantSealer
from .inbox import InboxPage, OpenTo, pending_inputs
from .session_client import SessionClient

log = logging.getLogger("turnkit.runtime")

_S = TypeVar("_S", bound=SessionClient)


class RuntimeClient:
    """Submits, answers, cancels, resets and follows agents' turns over one store,
    for the processes that run them (``turnkit worker``, a ``Worker``). Use it with
    ``async with``.

    It runs no turn, no tool and no timer: what it stores, a worker on the same
    store runs. ``session(agent, id)`` gives a ``SessionClient`` with the calls a
    session has besides running turns here (``submit``, ``turn``, ``resume``,
    ``cancel``, ``reset``, ``observe``, ``result``, …). A turn run elsewhere is
    followed by reading the store at most ``poll`` seconds apart, and its live
    deltas come through the store's relay where it has one (PostgreSQL). The agents
    are the ones the workers run: each turn is stored with its agent's policy and
    version, and a typed answer is parsed by its agent's ``output_type``.
    """

    def __init__(
        self,
        agents: Agent | Sequence[Agent],
        *,
        store: Store,
        sink: EventSink | None = None,
        session_cache: int = 1000,
        poll: float = 0.5,
    ) -> None:
        listed = [agents] if isinstance(agents, Agent) else list(agents)
        self.agents: dict[str, Agent] = {}
        for agent in listed:
            if not isinstance(agent, Agent):
                raise ConfigurationError(
                    f"{type(self).__name__} agents must be Agent objects, got {agent!r}"
                )
            if agent.name in self.agents:
                raise ConfigurationError(f"two agents are named {agent.name!r}")
            self.agents[agent.name] = agent
        if not isinstance(store, Store):
            raise ConfigurationError(
                f"store must implement turnkit.stores.Store (MemoryStore, SqliteStore, …), "
                f"got {type(store).__name__}"
            )
        if sink is not None and not isinstance(sink, EventSink):
            raise ConfigurationError(
                "sink must implement turnkit.EventSink (emit, subscribe), "
                f"got {type(sink).__name__}"
            )
        self.store = store
        #: The store, if it places sessions by tenant (cells): told before each
        #: delivery and each first submission. Checked once here: a protocol check
        #: walks the protocol's members, too slow to make for every turn.
        self.placing: PlacingStore | None = store if isinstance(store, PlacingStore) else None
        self.sink: EventSink = sink if sink is not None else LocalEventSink()
        if isinstance(session_cache, bool) or not isinstance(session_cache, int):
            raise ConfigurationError(f"session_cache must be an int, got {session_cache!r}")
        if session_cache < 0:
            raise ConfigurationError(f"session_cache must be 0 or more, got {session_cache}")
        #: How many idle session objects this process keeps (least recently used go
        #: first); busy ones are always kept. Memory is a cache: the store has it all.
        self.session_cache = session_cache
        if isinstance(poll, bool) or not isinstance(poll, int | float):
            raise ConfigurationError(f"poll must be a number, got {poll!r}")
        if not poll > 0:
            raise ConfigurationError(f"poll must be more than 0, got {poll!r}")
        #: The longest wait, in seconds, between two reads of a turn run elsewhere.
        self.poll = float(poll)
        # Seals the grants grant_answer issues; its key never leaves this process, and
        # it is no public attribute: a grant is made by grant_answer, never by hand.
        # Each session is handed it as it is made.
        self._grants = GrantSealer()
        self._sessions: OrderedDict[str, SessionClient] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._unrelay: Callable[[], None] | None = None

    async def __aenter__(self) -> Self:
        await self.store.open()
        self._loop = asyncio.get_running_loop()
        try:
            await self._opening()
        except BaseException:
            self._loop = None
            await self._closing()
            await self.store.close()
            raise
        relay = self.relay
        if relay is not None:
            self._unrelay = self.sink.subscribe(relay.publish)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the helper tasks, then close the store."""
        await _cancel_all(self._background)
        if self._unrelay is not None:
            self._unrelay()
            self._unrelay = None
        self._loop = None
        await self._closing()
        await self.store.close()

    async def _opening(self) -> None:
        """What else opens with the store (a ``Runtime``'s tool sources)."""

    async def _closing(self) -> None:
        """What else closes with the store."""

    @property
    def relay(self) -> EventRelay | None:
        """The store's relay of live events to other processes, if it has one."""
        return self.store.relay if isinstance(self.store, RelayingStore) else None

    @property
    def is_open(self) -> bool:
        """Whether it is inside its ``async with``."""
        return self._loop is not None

    def running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop it is open on; ``ConfigurationError`` when it is not open."""
        if self._loop is None:
            name = type(self).__name__
            raise ConfigurationError(f"the {name} is not open: use `async with {name}(...)`")
        return self._loop

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a helper task that is cancelled when this closes."""
        task = self.running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def cached_sessions(self) -> int:
        """How many session objects this process holds right now (for monitoring)."""
        return len(self._sessions)

    def session(self, agent_name: str, session_id: str) -> SessionClient:
        """The session ``session_id`` of agent ``agent_name``: the same object each
        time while it is busy or among the ``session_cache`` most recently used."""
        return self._session(agent_name, session_id, SessionClient)

    def _session(self, agent_name: str, session_id: str, kind: type[_S]) -> _S:
        agent = self.agents.get(agent_name)
        if agent is None:
            raise ConfigurationError(
                f"unknown agent {agent_name!r}; this runtime has {sorted(self.agents)}"
            )
        if not isinstance(session_id, str) or not session_id:
            raise ConfigurationError("session_id must be a non-empty string")
        if (bad := unstorable(session_id)) is not None:
            raise ConfigurationError(f"session_id {session_id!r} contains {bad}")
        existing = self._sessions.get(session_id) or self._busy_session(session_id)
        if existing is not None:
            if existing.agent.name != agent_name:
                raise ConfigurationError(
                    f"session {session_id!r} belongs to agent {existing.agent.name!r}"
                )
            assert isinstance(existing, kind)  # one kind per process: this class's
            self._sessions[session_id] = existing
            self._sessions.move_to_end(session_id)
            return existing
        session = kind(self, agent, self.store.session(session_id), self._grants)
        self._sessions[session_id] = session
        self._trim()
        return session

    def _busy_session(self, session_id: str) -> SessionClient | None:
        """A session kept busy past the cache's bound (a ``Runtime``'s deliveries)."""
        return None

    def _trim(self) -> None:
        """Drop the least recently used idle sessions beyond ``session_cache``."""
        excess = len(self._sessions) - self.session_cache
        if excess <= 0:
            return
        drop: list[str] = []
        for sid, session in self._sessions.items():  # oldest first; usually the first
            if session.idle:
                drop.append(sid)
                if len(drop) == excess:
                    break
        for sid in drop:
            del self._sessions[sid]

    async def sessions(self) -> list[SessionInfo]:
        """Every session the store holds, with its agent and status."""
        return await all_sessions(self.store)

    async def pending_inputs(
        self,
        by: str | Sequence[str],
        *,
        principal: Any = None,
        limit: int = 50,
        after: str | None = None,
        open_to: OpenTo | None = None,
    ) -> InboxPage:
        """Every open question ``by`` may answer, across these sessions and agents,
        oldest first: ``limit`` at most per page (a page ends between turns, so one
        turn's questions may take it a little past), the next page from
        ``after=page.next``.

        ``by`` is the answerer's verified name (or names: the first is the one a
        policy is asked about). A question is theirs when a ``user`` answerer names
        them, or a ``policy`` answerer's ``authorize_answer(AnswerCheck(..., by,
        principal))`` says yes (asked once per policy and page); a question that
        names nobody only when ``open_to(agent, session_id)`` says so (the HTTP
        inbox asks ``authorize`` whether they may resume the session). Answer one
        with ``session(item.agent, item.session_id).resume(...)``.
        """
        return await pending_inputs(
            self.store,
            self.agents,
            by,
            principal=principal,
            limit=limit,
            after=after,
            open_to=open_to,
        )


async def _cancel_all(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end. A cancellation a library swallowed
    (Python 3.11's ``asyncio.wait_for`` can, when the awaited call completes at the
    same moment) is asked again, so closing never waits on a loop that ran on."""
    while pending := [t for t in tasks if not t.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.5)
    await asyncio.gather(*tasks, return_exceptions=True)
