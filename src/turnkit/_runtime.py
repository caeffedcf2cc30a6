"""``Runtime`` and ``AgentSession``: queue turns per session, run them, and report on them.

Turns on one session run one after another in the order they were started; turns
on different sessions run concurrently. Nothing here touches SQL or a model: the
runtime schedules ``TurnRunner``s over the seams it was given.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType

from ._agent import Agent
from ._engine import TurnRunner
from ._errors import ConfigurationError, TurnError, TurnFailedError
from ._events import TERMINAL_EVENT_TYPES, EventSink, LocalEventSink, TurnEvent
from ._inbound import InboundEvent, Proactive
from ._messages import Message, OpeningMessage, TriggerMessage, UserMessage
from ._store import SessionInfo, SessionStatus, SessionStore, Store
from ._turns import TurnRequest, TurnResult, result_from_record

log = logging.getLogger("turnkit.runtime")

#: How many finished turns' in-memory results each session keeps for ``result()``.
_RECENT_RESULTS = 256


class AgentSession:
    """One conversation with one agent, addressed by ``session_id``."""

    def __init__(self, runtime: Runtime, agent: Agent, store: SessionStore) -> None:
        self.runtime = runtime
        self.agent = agent
        self._store = store
        self._queue: deque[tuple[TurnRequest, asyncio.Future[TurnResult]]] = deque()
        self._futures: OrderedDict[str, asyncio.Future[TurnResult]] = OrderedDict()
        self._worker: asyncio.Task[None] | None = None

    @property
    def session_id(self) -> str:
        return self._store.session_id

    # -- starting turns ----------------------------------------------------------

    def start(
        self,
        text: str,
        *,
        event: InboundEvent | None = None,
        trigger: Proactive | None = None,
        turn_id: str | None = None,
    ) -> str:
        """Queue a turn and return its id at once; the opening commits when it runs.

        Passing the ``turn_id`` of an earlier delivery replays that turn from its
        last checkpoint instead of opening a new one (``text`` is then ignored).
        """
        if not isinstance(text, str):
            raise TypeError(f"turn text must be a str, got {type(text).__name__}")
        if event is not None and trigger is not None:
            raise ConfigurationError("a turn has either an inbound event or a trigger, not both")
        if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
            raise ConfigurationError("turn_id must be a non-empty string")
        tid = turn_id or uuid.uuid4().hex
        pending = self._futures.get(tid)
        if pending is not None and not pending.done():
            return tid  # already queued or running here: one delivery is enough
        opening: OpeningMessage = (
            TriggerMessage(text=text, turn_id=tid, by=trigger.by)
            if trigger is not None
            else UserMessage(text=text, turn_id=tid)
        )
        loop = self.runtime._require_loop()
        future: asyncio.Future[TurnResult] = loop.create_future()
        self._remember(tid, future)
        self._queue.append((TurnRequest(turn_id=tid, opening=opening, event=event), future))
        if self._worker is None:
            self._worker = loop.create_task(self._drain(), name=f"turnkit:{self.session_id}")
        return tid

    async def turn(
        self,
        text: str,
        *,
        event: InboundEvent | None = None,
        trigger: Proactive | None = None,
        turn_id: str | None = None,
    ) -> str:
        """Start a turn and wait for its answer; raise ``TurnFailedError`` if it fails."""
        tid = self.start(text, event=event, trigger=trigger, turn_id=turn_id)
        result = await self.result(tid)
        if result.status != "completed":
            raise TurnFailedError(result.turn_id, result.error or result.status)
        return result.text or ""

    def _remember(self, turn_id: str, future: asyncio.Future[TurnResult]) -> None:
        self._futures[turn_id] = future
        self._futures.move_to_end(turn_id)
        while len(self._futures) > _RECENT_RESULTS:
            oldest, fut = next(iter(self._futures.items()))
            if not fut.done():
                break
            del self._futures[oldest]

    async def _drain(self) -> None:
        try:
            while self._queue:
                request, future = self._queue.popleft()
                runner = TurnRunner(
                    agent=self.agent,
                    store=self._store,
                    sink=self.runtime.sink,
                    request=request,
                    runtime=self.runtime,
                )
                try:
                    future.set_result(await runner.run())
                except Exception as exc:
                    log.exception("turn %s on session %s crashed", request.turn_id, self.session_id)
                    future.set_exception(exc)
                except BaseException:
                    # Cancellation or interpreter exit: nobody may wait forever on this turn.
                    future.cancel()
                    raise
        finally:
            self._worker = None
            for _, future in self._queue:
                future.cancel()
            self._queue.clear()

    def _is_pending(self, turn_id: str) -> bool:
        future = self._futures.get(turn_id)
        return future is not None and not future.done()

    # -- reading results and state -----------------------------------------------

    async def result(self, turn_id: str) -> TurnResult:
        """Wait for the turn to end here, or read how it ended from the store."""
        future = self._futures.get(turn_id)
        if future is not None:
            return await asyncio.shield(future)
        record = await self._store.turn(turn_id)
        if record is None:
            raise TurnError(f"session {self.session_id} has no turn {turn_id}")
        if record.status == "running":
            raise TurnError(
                f"turn {turn_id} is unfinished and not running in this process; "
                "redeliver it with start(..., turn_id=...) or call runtime.recover()"
            )
        return result_from_record(record)

    async def messages(self) -> list[Message]:
        """The live transcript, oldest first."""
        return await self._store.messages()

    async def status(self) -> SessionStatus:
        """``new``, ``running``, ``suspended`` or ``idle``."""
        return await self._store.status()

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        """Structural events logged for the session (or one turn) with ``seq > after``."""
        return await self._store.events(turn_id=turn_id, after=after)

    # -- observing ---------------------------------------------------------------

    async def observe(self, turn_id: str, *, replay: bool = False) -> AsyncIterator[TurnEvent]:
        """Yield the turn's events as they happen, ending after its terminal event.

        With ``replay=True`` the events already logged for the turn come first, so a
        late observer misses nothing structural (live deltas are never replayed).
        """
        async for event in self._stream(turn_id, replay=replay):
            yield event

    def subscribe(
        self,
        callback: Callable[[TurnEvent], None],
        *,
        turn_id: str | None = None,
        replay: bool = False,
    ) -> Callable[[], None]:
        """Call ``callback`` with this session's events (one turn's, if given).

        Returns the function that unsubscribes. A callback that raises is logged and
        skipped; it never breaks the turn or other subscribers.
        """
        if not replay:
            sid = self.session_id

            def filtered(event: TurnEvent) -> None:
                if event.session_id == sid and (turn_id is None or event.turn_id == turn_id):
                    callback(event)

            return self.runtime.sink.subscribe(filtered)

        async def forward() -> None:
            async for event in self._stream(turn_id, replay=True):
                try:
                    callback(event)
                except Exception:
                    log.exception("subscriber %r raised on %s; ignored", callback, event.type)

        task = self.runtime._require_loop().create_task(forward())

        def unsubscribe() -> None:
            task.cancel()

        return unsubscribe

    async def _stream(self, turn_id: str | None, *, replay: bool) -> AsyncIterator[TurnEvent]:
        queue: asyncio.Queue[TurnEvent] = asyncio.Queue()
        sid = self.session_id

        def enqueue(event: TurnEvent) -> None:
            if event.session_id == sid and (turn_id is None or event.turn_id == turn_id):
                queue.put_nowait(event)

        unsubscribe = self.runtime.sink.subscribe(enqueue)
        try:
            last_seq = 0
            if replay or (turn_id is not None and not self._is_pending(turn_id)):
                logged = await self._store.events(turn_id=turn_id)
                if turn_id is not None:
                    logged = _since_last_start(logged)
                    if not logged and not self._is_pending(turn_id):
                        await self._check_observable(turn_id)
                for event in logged:
                    last_seq = event.seq or last_seq
                    if replay or event.type in TERMINAL_EVENT_TYPES:
                        yield event
                    if turn_id is not None and event.type in TERMINAL_EVENT_TYPES:
                        return
                if turn_id is not None and not self._is_pending(turn_id):
                    await self._check_observable(turn_id)
            while True:
                event = await queue.get()
                if event.seq is not None and event.seq <= last_seq:
                    continue
                yield event
                if turn_id is not None and event.type in TERMINAL_EVENT_TYPES:
                    return
        finally:
            unsubscribe()

    async def _check_observable(self, turn_id: str) -> None:
        record = await self._store.turn(turn_id)
        if record is None:
            raise TurnError(f"session {self.session_id} has no turn {turn_id}")
        if record.status == "running":
            raise TurnError(
                f"turn {turn_id} is unfinished and not running in this process; "
                "nothing would arrive (redeliver it or call runtime.recover())"
            )


def _since_last_start(events: list[TurnEvent]) -> list[TurnEvent]:
    """A retried turn logs ``turn.started`` again; earlier events belong to a failed try."""
    for i in range(len(events) - 1, -1, -1):
        if events[i].type == "turn.started":
            return events[i:]
    return events


class Runtime:
    """Runs agents' turns over one store and one event sink. Use it with ``async with``.

    ``recover()`` replays the turns a dead process left unfinished; call it at
    startup so a crash needs no caller to redeliver.
    """

    def __init__(
        self,
        agents: Agent | Sequence[Agent],
        *,
        store: Store,
        sink: EventSink | None = None,
    ) -> None:
        listed = [agents] if isinstance(agents, Agent) else list(agents)
        self.agents: dict[str, Agent] = {}
        for agent in listed:
            if not isinstance(agent, Agent):
                raise ConfigurationError(f"Runtime agents must be Agent objects, got {agent!r}")
            if agent.name in self.agents:
                raise ConfigurationError(f"two agents are named {agent.name!r}")
            self.agents[agent.name] = agent
        self.store = store
        self.sink: EventSink = sink if sink is not None else LocalEventSink()
        self._sessions: dict[str, AgentSession] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> Runtime:
        await self.store.open()
        self._loop = asyncio.get_running_loop()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        workers = [s._worker for s in self._sessions.values() if s._worker is not None]
        if exc_type is None:
            await asyncio.gather(*workers, return_exceptions=True)
        else:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        self._loop = None
        await self.store.close()

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise ConfigurationError("the Runtime is not open: use `async with Runtime(...)`")
        return self._loop

    def session(self, agent_name: str, session_id: str) -> AgentSession:
        """The session ``session_id`` of agent ``agent_name`` (the same object each time)."""
        agent = self.agents.get(agent_name)
        if agent is None:
            raise ConfigurationError(
                f"unknown agent {agent_name!r}; this runtime has {sorted(self.agents)}"
            )
        if not isinstance(session_id, str) or not session_id:
            raise ConfigurationError("session_id must be a non-empty string")
        existing = self._sessions.get(session_id)
        if existing is not None:
            if existing.agent.name != agent_name:
                raise ConfigurationError(
                    f"session {session_id!r} belongs to agent {existing.agent.name!r}"
                )
            return existing
        session = AgentSession(self, agent, self.store.session(session_id))
        self._sessions[session_id] = session
        return session

    async def sessions(self) -> list[SessionInfo]:
        """Every session the store holds, with its agent and status."""
        return await self.store.sessions()

    async def recover(self) -> list[TurnResult]:
        """Replay every turn left unfinished in the store and wait for them to end."""
        self._require_loop()
        waits = []
        for record in await self.store.unfinished_turns():
            if record.agent not in self.agents:
                log.warning(
                    "cannot recover turn %s: agent %r is not in this runtime",
                    record.turn_id,
                    record.agent,
                )
                continue
            session = self.session(record.agent, record.session_id)
            turn_id = session.start(str(record.opening.get("text", "")), turn_id=record.turn_id)
            waits.append(session.result(turn_id))
        return list(await asyncio.gather(*waits))
