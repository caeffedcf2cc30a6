"""``Runtime``: runs agents' turns over one store and one event sink, and keeps a
bounded cache of the sessions it has touched (``AgentSession``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any

from .._engine.agent import Agent
from .._engine.rate_waits import RateLimiter
from .._engine.tool_sources import OpenedToolSource
from .._errors import ConfigurationError
from .._seams.rates import RateStore
from .._seams.relay import EventRelay, RelayingStore
from .._seams.sink import EventSink, LocalEventSink
from .._seams.store import Store, all_sessions
from .._seams.timers import TimerStore
from .._seams.tracer import NO_TRACER, Tracer
from .._values.budgets import Budget
from .._values.events import InputRequestedEvent, TurnEvent
from .._values.rate_limits import RateLimit
from .._values.records import SessionInfo, TurnRecord
from .._values.tenancy import UNCAPPED, Concurrency
from .._values.text import unstorable
from .._values.turns import TurnResult
from .approvals import GrantSealer
from .children import RuntimeChildren
from .inbox import InboxPage, OpenTo, pending_inputs
from .local_rates import LocalRates
from .retention import PruneReport, Retention, prune
from .session import AgentSession
from .timers import TimerLoop

log = logging.getLogger("turnkit.runtime")


class Runtime:
    """Runs agents' turns over one store and one event sink. Use it with ``async with``.

    ``recover()`` replays the turns a dead process left unfinished; call it at
    startup so a crash needs no caller to redeliver. ``tracer`` (for instance
    ``turnkit.otel.OtelTracer()``) receives a span for every turn, model step and
    tool call.

    With ``run_turns=False`` the runtime runs no turn itself: it stores them
    (``submit``, ``resume``, ``cancel`` and ``reset`` all work) for the workers
    (``turnkit.Worker``) on the same store, and follows them through the store,
    reading it at most ``remote_poll`` seconds apart: an HTTP node's runtime.

    A runtime that runs turns also fires the store's timers (deadlines, reminders,
    sleeps, retry backoffs; see docs/durable-time.md), one process per store at a
    time; ``timers=False`` leaves them to others (a one-shot command).
    """

    def __init__(
        self,
        agents: Agent | Sequence[Agent],
        *,
        store: Store,
        sink: EventSink | None = None,
        session_cache: int = 1000,
        tracer: Tracer | None = None,
        run_turns: bool = True,
        remote_poll: float = 0.5,
        retention: Retention | None = None,
        concurrency: Concurrency | None = None,
        timers: bool = True,
        budget: Budget | None = None,
        rate_limits: Sequence[RateLimit] = (),
    ) -> None:
        listed = [agents] if isinstance(agents, Agent) else list(agents)
        #: Deliveries stopped because another process took their turn over (their
        #: late commit was fenced off), for monitoring.
        self.fenced_deliveries = 0
        self.agents: dict[str, Agent] = {}
        for agent in listed:
            if not isinstance(agent, Agent):
                raise ConfigurationError(f"Runtime agents must be Agent objects, got {agent!r}")
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
        self.sink: EventSink = sink if sink is not None else LocalEventSink()
        if tracer is not None and not isinstance(tracer, Tracer):
            raise ConfigurationError(
                "tracer must implement turnkit.Tracer (current, turn), e.g. "
                f"turnkit.otel.OtelTracer(), got {type(tracer).__name__}"
            )
        #: Where the spans of every turn, model step and tool call go (see
        #: docs/tracing.md); the default records nothing.
        self.tracer: Tracer = tracer if tracer is not None else NO_TRACER
        # Seals the grants grant_answer issues; its key never leaves this process, and
        # it is no public attribute: a grant is made by grant_answer, never by hand.
        # Each session is handed it as it is made.
        self._grants = GrantSealer()
        if isinstance(session_cache, bool) or not isinstance(session_cache, int):
            raise ConfigurationError(f"session_cache must be an int, got {session_cache!r}")
        if session_cache < 0:
            raise ConfigurationError(f"session_cache must be 0 or more, got {session_cache}")
        #: How many idle session objects this runtime keeps (least recently used go
        #: first); busy ones are always kept. Memory is a cache: the store has it all.
        self.session_cache = session_cache
        if not isinstance(run_turns, bool):
            raise ConfigurationError(f"run_turns must be a bool, got {run_turns!r}")
        if isinstance(remote_poll, bool) or not isinstance(remote_poll, int | float):
            raise ConfigurationError(f"remote_poll must be a number, got {remote_poll!r}")
        if not remote_poll > 0:
            raise ConfigurationError(f"remote_poll must be more than 0, got {remote_poll!r}")
        #: Whether turns run in this process (``False``: workers elsewhere run them).
        self.run_turns = run_turns
        if concurrency is not None and not isinstance(concurrency, Concurrency):
            raise ConfigurationError(
                f"concurrency must be a turnkit.Concurrency, got {type(concurrency).__name__}"
            )
        #: The per-tenant caps on how many sessions run at once (docs/tenants.md):
        #: enforced by each claim on a shared store, and by this process's deliveries
        #: on a store only it runs turns from.
        self.concurrency: Concurrency = concurrency if concurrency is not None else UNCAPPED
        self._tenant_gates: dict[str, asyncio.Semaphore] = {}
        if budget is not None and not isinstance(budget, Budget):
            raise ConfigurationError(f"budget must be a turnkit.Budget, got {budget!r}")
        #: Spending limits checked before each model step, and the usage ledger they
        #: read (docs/tenants.md); ``None``: neither.
        self.budget: Budget | None = budget
        limits = list(rate_limits)
        for limit in limits:
            if not isinstance(limit, RateLimit):
                raise ConfigurationError(f"rate_limits takes RateLimit values, got {limit!r}")
        if len({limit.model for limit in limits}) != len(limits):
            raise ConfigurationError("rate_limits names one model twice")
        #: The model rate limits, kept in the store's log where it keeps one (shared by
        #: every process on it: PostgreSQL), else in this process (docs/tenants.md).
        self.rates: RateLimiter | None = (
            RateLimiter(limits, store if isinstance(store, RateStore) else LocalRates())
            if limits
            else None
        )
        #: The longest wait, in seconds, between two reads of a turn run elsewhere.
        self.remote_poll = float(remote_poll)
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigurationError(
                f"retention must be a turnkit.Retention, got {type(retention).__name__}"
            )
        #: How long the store keeps what is done with; a ``Worker`` prunes by it (see
        #: ``prune``). ``None``: everything is kept.
        self.retention = retention
        self._sessions: OrderedDict[str, AgentSession] = OrderedDict()
        #: Sessions with a worker running here, cached or not (see AgentSession.idle).
        self._busy: dict[str, AgentSession] = {}
        self.children = RuntimeChildren(self, self._grants)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._unrelay: Callable[[], None] | None = None
        self._opened: list[OpenedToolSource] = []
        #: Fires the deadlines, reminders, sleeps and retry backoffs of parked turns
        #: (see ``turnkit._runtime.timers``); it runs while the runtime is open and
        #: runs turns, on a store that can list them (every built-in one).
        self.timers = TimerLoop(self)
        if not isinstance(timers, bool):
            raise ConfigurationError(f"timers must be a bool, got {timers!r}")
        self._timers_wanted = timers
        #: Whether a ``Worker`` delivers this runtime's runnable turns by claiming
        #: them from the store: then a turn the timers wake is left to the claims.
        self.claims_turns = False
        self._untimer: Callable[[], None] | None = None

    async def __aenter__(self) -> Runtime:
        await self.store.open()
        self._loop = asyncio.get_running_loop()
        try:
            await self._open_sources()
        except BaseException:
            self._loop = None
            await self._close_sources()
            await self.store.close()
            raise
        relay = self.relay
        if relay is not None:
            self._unrelay = self.sink.subscribe(relay.publish)
        if self.run_timers and isinstance(self.store, TimerStore):
            self._untimer = self.sink.subscribe(self._nudge_timers)
            self.spawn(self.timers.run())
        return self

    def _nudge_timers(self, event: TurnEvent) -> None:
        """A turn parked here with a clock: the timer loop looks again now."""
        if isinstance(event, InputRequestedEvent) and any(
            r.wake_at is not None for r in event.requests
        ):
            self.timers.nudge()

    async def settle(self, record: TurnRecord, now: float) -> str | None:
        """Act on what the clock has made due of parked turn ``record`` by ``now``
        (the timer loop's call; see ``AgentSession.settle_clock``)."""
        session = self.session(record.agent, record.session_id)
        return await session.settle_clock(record.turn_id, now)

    @property
    def run_timers(self) -> bool:
        """Whether this runtime fires the store's timers while it is open: when it
        runs turns (read as it opens) and ``timers`` was not turned off (a one-shot
        command's runtime, which should not take on other sessions' deadlines)."""
        return self._timers_wanted and self.run_turns

    @property
    def relay(self) -> EventRelay | None:
        """The store's relay of live events to other processes, if it has one."""
        return self.store.relay if isinstance(self.store, RelayingStore) else None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Wait for queued turns to finish (or, on an error, cancel them), then close."""
        # (A worker cancelled before it ever ran never reaches its ``finally``: done
        # tasks are skipped, so closing cannot spin on one.)
        while workers := [
            task
            for s in self._busy.values()
            if (task := s.draining) is not None and not task.done()
        ]:
            if exc_type is not None:
                for task in workers:
                    task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        await _cancel_all(self._background)
        for undo in (self._unrelay, self._untimer):
            if undo is not None:
                undo()
        self._unrelay = self._untimer = None
        self._loop = None
        await self._close_sources()
        await self.store.close()

    async def _open_sources(self) -> None:
        """Open the agents' tool sources that share something while the runtime runs
        (an MCP server's connection), each once."""
        seen: set[int] = set()
        for agent in self.agents.values():
            for source in agent.tool_sources:
                if isinstance(source, OpenedToolSource) and id(source) not in seen:
                    seen.add(id(source))
                    await source.open()
                    self._opened.append(source)

    async def _close_sources(self) -> None:
        opened, self._opened = self._opened, []
        for source in opened:
            try:
                await source.close()
            except Exception:
                log.warning("closing tool source %r failed", source, exc_info=True)

    @property
    def is_open(self) -> bool:
        """Whether the runtime is inside its ``async with`` (turns can run)."""
        return self._loop is not None

    def running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the runtime is open on; ``ConfigurationError`` when it is
        not open."""
        if self._loop is None:
            raise ConfigurationError("the Runtime is not open: use `async with Runtime(...)`")
        return self._loop

    def mark_busy(self, session: AgentSession) -> None:
        """Keep ``session`` (past the cache's bound) while it delivers here."""
        self._busy[session.session_id] = session

    def mark_idle(self, session: AgentSession) -> None:
        """``session`` delivers nothing here any more: the cache's bound applies."""
        if self._busy.get(session.session_id) is session:
            del self._busy[session.session_id]

    def tenant_gate(self, tenant: str) -> asyncio.Semaphore | None:
        """What this process's deliveries of ``tenant``'s turns wait on to respect its
        cap when no claim does (``None``: uncapped, or workers claim the turns)."""
        cap = self.concurrency.cap(tenant)
        if cap is None or self.claims_turns:
            return None
        gate = self._tenant_gates.get(tenant)
        if gate is None:
            gate = self._tenant_gates[tenant] = asyncio.Semaphore(cap)
        return gate

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a helper task that the runtime cancels when it closes."""
        task = self.running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def cached_sessions(self) -> int:
        """How many session objects this runtime holds right now (for monitoring)."""
        return len(self._sessions)

    def note_fenced(self) -> None:
        """Count a delivery stopped because another process took its turn over."""
        self.fenced_deliveries += 1

    @property
    def running_sessions(self) -> int:
        """How many sessions have a delivery running in this process (for monitoring)."""
        return len(self._busy)

    def session(self, agent_name: str, session_id: str) -> AgentSession:
        """The session ``session_id`` of agent ``agent_name``: the same object each
        time while it is busy or among the ``session_cache`` most recently used."""
        agent = self.agents.get(agent_name)
        if agent is None:
            raise ConfigurationError(
                f"unknown agent {agent_name!r}; this runtime has {sorted(self.agents)}"
            )
        if not isinstance(session_id, str) or not session_id:
            raise ConfigurationError("session_id must be a non-empty string")
        if (bad := unstorable(session_id)) is not None:
            raise ConfigurationError(f"session_id {session_id!r} contains {bad}")
        existing = self._sessions.get(session_id) or self._busy.get(session_id)
        if existing is not None:
            if existing.agent.name != agent_name:
                raise ConfigurationError(
                    f"session {session_id!r} belongs to agent {existing.agent.name!r}"
                )
            self._sessions[session_id] = existing
            self._sessions.move_to_end(session_id)
            return existing
        session = AgentSession(self, agent, self.store.session(session_id), self._grants)
        self._sessions[session_id] = session
        self._trim()
        return session

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
        """Every open question ``by`` may answer, across this runtime's sessions and
        agents, oldest first: ``limit`` at most per page (a page ends between turns,
        so one turn's questions may take it a little past), the next page from
        ``after=page.next``.

        ``by`` is the answerer's verified name (or names: the first is the one a
        policy is asked about). A question is theirs when a ``user`` answerer names
        them, or a ``policy`` answerer's ``authorize_answer(AnswerCheck(..., by,
        principal))`` says yes (asked once per policy and page); a question that
        names nobody only when ``open_to(agent, session_id)`` says so (the HTTP
        inbox asks ``authorize`` whether they may resume the session). Answer one
        with ``runtime.session(item.agent, item.session_id).resume(...)``.
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

    async def prune(self, *, apply: bool = True, now: float | None = None) -> PruneReport:
        """Delete what the runtime's ``retention`` has aged out of its store (see
        ``turnkit.Retention``); with ``apply=False`` only count it. Safe to run
        beside turns in any number of processes: a session with anything unfinished
        is never deleted."""
        if self.retention is None:
            raise ConfigurationError("this runtime has no retention: Runtime(retention=...)")
        return await prune(self.store, self.retention, apply=apply, now=now)

    async def recover(self) -> list[TurnResult]:
        """Replay every turn left unfinished in the store and wait for them to end.

        Returns the results of the deliveries that ran to an end; one that cannot
        run (its agent is missing, the store fails again) is logged and skipped, so
        it never keeps the others from recovering.
        """
        self.running_loop()
        if not self.run_turns:
            return []  # the workers recover them
        waits = []
        for record in await self.store.unfinished_turns():
            try:
                session = self.session(record.agent, record.session_id)
            except ConfigurationError as exc:
                log.warning("cannot recover turn %s: %s", record.turn_id, exc)
                continue
            turn_id = session.start(record.opening.text, turn_id=record.turn_id)
            waits.append(session.result(turn_id))
        results: list[TurnResult] = []
        for outcome in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(outcome, TurnResult):
                results.append(outcome)
            else:
                log.warning("recovering a turn failed again: %s", outcome)
        return results


async def _cancel_all(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end. A cancellation a library swallowed
    (Python 3.11's ``asyncio.wait_for`` can, when the awaited call completes at the
    same moment) is asked again, so closing never waits on a loop that ran on."""
    while pending := [t for t in tasks if not t.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.5)
    await asyncio.gather(*tasks, return_exceptions=True)
