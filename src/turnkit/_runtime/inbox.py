"""The inbox: every open question one answerer may answer, across sessions and agents.

``pending_inputs`` walks the store's parked turns oldest first (``InboxStore``), a
page at a time, and keeps the questions that name the caller (a ``user`` answerer
under one of their names), a policy the agent's ``authorize_answer`` grants them,
or (when the caller's ``open_to`` says so) nobody in particular. Pages are keyed
by an opaque cursor (the last turn's place) and end between turns, so a page is
never shifted by questions asked or answered meanwhile.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._engine.agent import Agent
from .._errors import ConfigurationError
from .._seams.inbox import InboxStore, ParkedKey
from .._seams.store import Store
from .._values.inputs import AnswerCheck, Answerer, InputRequest
from .._values.messages import JsonObject
from .._values.records import TurnRecord

#: Most questions one page holds.
MAX_LIMIT = 500
#: Whether a question nobody in particular may answer is the caller's to see:
#: ``open_to(agent, session_id)``.
OpenTo = Callable[[str, str], Awaitable[bool]]


@dataclass(frozen=True, kw_only=True)
class PendingInput:
    """One open question the caller may answer, and where it waits.

    ``answer_as`` is the name the caller answers it under (``by`` of the resume)
    when the question names them; ``None`` when a policy grant or nobody in
    particular admits them. ``asked_at`` is when it was asked (the turn's start
    for a request stored before turnkit kept the time).
    """

    agent: str
    session_id: str
    request: InputRequest
    asked_at: float
    answer_as: str | None

    @property
    def turn_id(self) -> str:
        return self.request.turn_id

    @property
    def expires_at(self) -> float | None:
        """The question's deadline (seconds since the epoch), if it has one."""
        return self.request.expires_at

    def age(self, now: float | None = None) -> float:
        """Seconds since the question was asked."""
        return max(0.0, (time.time() if now is None else now) - self.asked_at)

    def to_dict(self, now: float | None = None) -> JsonObject:
        return {
            "agent": self.agent,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "request": self.request.to_dict(),
            "asked_at": self.asked_at,
            "age_seconds": round(self.age(now), 3),
            "expires_at": self.expires_at,
            "answer_as": self.answer_as,
        }


@dataclass(frozen=True, kw_only=True)
class InboxPage:
    """One page of the inbox, oldest question first; ``next`` is the cursor of the
    page after it (``pending_inputs(..., after=page.next)``), ``None`` at the end."""

    items: list[PendingInput]
    next: str | None


def encode_cursor(key: ParkedKey) -> str:
    """The opaque cursor of the page after the turn ``key``."""
    return json.dumps(list(key), separators=(",", ":")).encode().hex()


def decode_cursor(cursor: str) -> ParkedKey:
    """The turn key a cursor holds; ``ValueError`` if it is not one of ours."""
    try:
        at, session_id, turn_id = json.loads(bytes.fromhex(cursor))
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise ValueError
        if not (isinstance(session_id, str) and isinstance(turn_id, str)):
            raise ValueError
    except (ValueError, TypeError, UnicodeDecodeError):
        raise ValueError(f"not an inbox cursor: {cursor[:60]!r}") from None
    return (float(at), session_id, turn_id)


class _Admission:
    """Whether the caller may answer a question, with each policy asked once."""

    def __init__(
        self,
        agents: Mapping[str, Agent],
        names: tuple[str, ...],
        principal: Any,
        open_to: OpenTo | None,
    ) -> None:
        self._agents = agents
        self._names = names
        self._principal = principal
        self._open_to = open_to
        self._granted: dict[tuple[str, str, str | None], bool] = {}
        self._open: dict[tuple[str, str], bool] = {}

    async def answer_as(
        self, agent: str, session_id: str, request: InputRequest
    ) -> str | bool | None:
        """The name the caller answers under, ``None`` if admitted otherwise, ``False``
        if not admitted."""
        if not request.answerers:
            if self._open_to is None:
                return False
            key = (agent, session_id)
            if key not in self._open:
                self._open[key] = bool(await self._open_to(agent, session_id))
            return None if self._open[key] else False
        for answerer in request.answerers:
            if answerer.kind == "user" and answerer.user_id in self._names:
                return answerer.user_id
        for answerer in request.answerers:
            if answerer.kind == "policy" and await self._grants(agent, answerer):
                return None
        return False

    async def _grants(self, agent: str, answerer: Answerer) -> bool:
        assert answerer.policy is not None
        key = (agent, answerer.policy, answerer.scope)
        if key not in self._granted:
            authorize = self._agents[agent].authorize_answer
            verdict = False
            if authorize is not None and self._names:
                check = AnswerCheck(
                    policy=answerer.policy,
                    scope=answerer.scope,
                    by=self._names[0],
                    principal=self._principal,
                )
                verdict = (await authorize(check)) is True
            self._granted[key] = verdict
        return self._granted[key]


async def pending_inputs(
    store: Store,
    agents: Mapping[str, Agent],
    by: str | Sequence[str],
    *,
    principal: Any = None,
    limit: int = 50,
    after: str | None = None,
    open_to: OpenTo | None = None,
    scan: int | None = None,
) -> InboxPage:
    """See ``Runtime.pending_inputs``."""
    names = (by,) if isinstance(by, str) else tuple(by)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"pending_inputs needs the answerer's name(s), got {by!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    if not isinstance(store, InboxStore):
        raise ConfigurationError(
            f"{type(store).__name__} cannot list parked turns across sessions "
            "(it does not implement turnkit.stores.InboxStore)"
        )
    admission = _Admission(agents, names, principal, open_to)
    budget = scan if scan is not None else max(1000, 20 * limit)
    key = decode_cursor(after) if after is not None else None
    items: list[PendingInput] = []
    scanned, size = 0, min(200, max(limit, 20))
    while True:
        page = await store.parked_turns(limit=size, after=key)
        for record in page:
            found = await _admitted(record, admission, agents)
            if items and len(items) + len(found) > limit:
                # Pages end between turns: the next starts with this one.
                return InboxPage(items=items, next=encode_cursor(key) if key else None)
            items.extend(found)
            key = (record.created_at, record.session_id, record.turn_id)
            scanned += 1
            if len(items) >= limit or scanned >= budget:
                # Full (or enough read for one call): the caller goes on from here.
                return InboxPage(items=items, next=encode_cursor(key))
        if len(page) < size:
            return InboxPage(items=items, next=None)


async def _admitted(
    record: TurnRecord, admission: _Admission, agents: Mapping[str, Agent]
) -> list[PendingInput]:
    """The questions of the parked turn ``record`` the caller may answer."""
    checkpoint = record.pending
    if checkpoint is None or record.cancel_reason is not None or record.agent not in agents:
        return []
    found = []
    for request in checkpoint.requests:
        if request.kind == "timer":
            continue  # a wait on the clock: nobody answers it
        verdict = await admission.answer_as(record.agent, record.session_id, request)
        if verdict is False:
            continue
        asked_at = request.asked_at if request.asked_at is not None else record.created_at
        found.append(
            PendingInput(
                agent=record.agent,
                session_id=record.session_id,
                request=request,
                asked_at=asked_at,
                answer_as=verdict if isinstance(verdict, str) else None,
            )
        )
    return found
