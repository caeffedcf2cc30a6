"""``Runtime``: runs agents' turns over one store and one event sink, and keeps a
bounded cache of the sessions it has touched (``AgentSession``). It is a
``RuntimeClient`` that also delivers turns, fires timers and recovers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

from .._engine.agent import Agent
from .._engine.rate_waits import RateLimiter
from .._engine.tool_sources import OpenedToolSource
from .._errors import ConfigurationError
from .._seams.rates import RateStore
from .._seams.sink import EventSink
from .._seams.store import Store
from .._seams.timers import TimerStore
from .._seams.tracer import NO_TRACER, Tracer
from .._values.budgets import Budget
from .._values.events import InputRequestedEvent, TurnEvent
from .._values.rate_limits import RateLimit
from .._values.records import TurnRecord
from .._values.tenancy import UNCAPPED, Concurrency
from .._values.turns import TurnResult
from .children import RuntimeChildren
from .client import RuntimeClient
from .local_rates import LocalRates
from .retention import PruneReport, Retention, prune
from .session import AgentSession
from .tenant_slots import TenantSlots
from .timers import TimerLoop

log = logging.getLogger("turnkit.runtime")


class Runtime(RuntimeClient):
    """Runs agents' turns over one store and one event sink. Use it with ``async with``.

    ``recover()`` replays the turns a dead process left unfinished; call it at
    startup so a crash needs no caller to redeliver. ``tracer`` (for instance
    ``turnkit.otel.OtelTracer()``) receives a span for every turn, model step and
    tool call. A process that only stores turns for workers elsewhere (an HTTP
    node) uses a ``RuntimeClient`` instead; a ``Runtime`` does all a client does.

    A runtime also fires the store's timers (deadlines, reminders, sleeps, retry
    backoffs; see docs/durable-time.md), one process per store at a time;
    ``timers=False`` leaves them to others (a one-shot command).
    """

    def __init__(
        self,
        agents: Agent | Sequence[Agent],
        *,
        store: Store,
        sink: EventSink | None = None,
        session_cache: int = 1000,
        tracer: Tracer | None = None,
        retention: Retention | None = None,
        concurrency: Concurrency | None = None,
        timers: bool = True,
        budget: Budget | None = None,
        rate_limits: Sequence[RateLimit] = (),
    ) -> None:
        super().__init__(agents, store=store, sink=sink, session_cache=session_cache)
        #: Deliveries stopped because another process took their turn over (their
        #: late commit was fenced off), for monitoring.
        self.fenced_deliveries = 0
        if tracer is not None and not isinstance(tracer, Tracer):
            raise ConfigurationError(
                "tracer must implement turnkit.Tracer (current, turn), e.g. "
                f"turnkit.otel.OtelTracer(), got {type(tracer).__name__}"
            )
        #: Where the spans of every turn, model step and tool call go (see
        #: docs/tracing.md); the default records nothing.
        self.tracer: Tracer = tracer if tracer is not None else NO_TRACER
        if concurrency is not None and not isinstance(concurrency, Concurrency):
            raise ConfigurationError(
                f"concurrency must be a turnkit.Concurrency, got {type(concurrency).__name__}"
            )
        #: The per-tenant caps on how many sessions run at once (docs/tenants.md):
        #: enforced by each claim on a shared store, and by this process's deliveries
        #: on a store only it runs turns from.
        self.concurrency: Concurrency = concurrency if concurrency is not None else UNCAPPED
        self._tenant_gates: dict[str, TenantSlots] = {}
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
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigurationError(
                f"retention must be a turnkit.Retention, got {type(retention).__name__}"
            )
        #: How long the store keeps what is done with; a ``Worker`` prunes by it (see
        #: ``prune``). ``None``: everything is kept.
        self.retention = retention
        #: Sessions with a worker running here, cached or not (see AgentSession.idle).
        self._busy: dict[str, AgentSession] = {}
        self.children = RuntimeChildren(self, self._grants)
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

    async def __aenter__(self) -> Self:
        await super().__aenter__()
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
        """Whether this runtime fires the store's timers while it is open: unless
        ``timers`` was turned off (a one-shot command's runtime, which should not
        take on other sessions' deadlines)."""
        return self._timers_wanted

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
        if self._untimer is not None:
            self._untimer()
            self._untimer = None
        await super().__aexit__(exc_type, exc, tb)

    async def _opening(self) -> None:
        """Open the agents' tool sources that share something while the runtime runs
        (an MCP server's connection), each once."""
        seen: set[int] = set()
        for agent in self.agents.values():
            for source in agent.tool_sources:
                if isinstance(source, OpenedToolSource) and id(source) not in seen:
                    seen.add(id(source))
                    await source.open()
                    self._opened.append(source)

    async def _closing(self) -> None:
        opened, self._opened = self._opened, []
        for source in opened:
            try:
                await source.close()
            except Exception:
                log.warning("closing tool source %r failed", source, exc_info=True)

    def mark_busy(self, session: AgentSession) -> None:
        """Keep ``session`` (past the cache's bound) while it delivers here."""
        self._busy[session.session_id] = session

    def mark_idle(self, session: AgentSession) -> None:
        """``session`` delivers nothing here any more: the cache's bound applies."""
        if self._busy.get(session.session_id) is session:
            del self._busy[session.session_id]

    def tenant_gate(self, tenant: str) -> TenantSlots | None:
        """What this process's deliveries of ``tenant``'s turns wait on to respect its
        cap when no claim does (``None``: uncapped, or workers claim the turns)."""
        cap = self.concurrency.cap(tenant)
        if cap is None or self.claims_turns:
            return None
        gate = self._tenant_gates.get(tenant)
        if gate is None:
            gate = self._tenant_gates[tenant] = TenantSlots(cap)
        return gate

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
        return self._session(agent_name, session_id, AgentSession)

    def _busy_session(self, session_id: str) -> AgentSession | None:
        return self._busy.get(session_id)

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

        Each turn runs under its stored tenant's cap, as any delivery here does; a
        subagent's child turn waits for a slot of its own until its parent, recovered
        here too, asks for it, and from then rides on the parent's (docs/tenants.md).
        Returns the results of the deliveries that ran to an end; one that cannot
        run (its agent is missing, the store fails again) is logged and skipped, so
        it never keeps the others from recovering.
        """
        self.running_loop()
        waits = []
        for record in await self.store.unfinished_turns():
            try:
                session = self.session(record.agent, record.session_id)
            except ConfigurationError as exc:
                log.warning("cannot recover turn %s: %s", record.turn_id, exc)
                continue
            turn_id = session.run_stored(record)
            waits.append(session.result(turn_id))
        results: list[TurnResult] = []
        for outcome in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(outcome, TurnResult):
                results.append(outcome)
            else:
                log.warning("recovering a turn failed again: %s", outcome)
        return results
