"""``ToolContext``: everything a tool may reach while it runs, and nothing more."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import jsonschema

from .._errors import FatalToolError
from .._values.checkpoints import InputAnswer
from .._values.frozen import quick_init
from .._values.inbound import InboundEvent
from .._values.inputs import (
    Answerer,
    Answerers,
    Expiry,
    InputRequest,
    as_answerers,
    check_schema,
    reminder_before_deadline,
)
from .._values.step_ids import call_input_id, input_step_id, note_step_id
from .._values.turns import TurnResult

if TYPE_CHECKING:
    from .._seams.store import StoreHandle


class AgentInfo(Protocol):
    """What a tool's context shows of the agent whose turn runs it (an ``Agent``)."""

    @property
    def name(self) -> str: ...

    @property
    def instructions(self) -> str: ...


@runtime_checkable
class ChildTurns(Protocol):
    """What a tool may ask of the runtime it runs in: a turn of another of its agents,
    run as a child of the calling tool's call (``turnkit.subagent`` is built on it)."""

    @property
    def agent_names(self) -> frozenset[str]:
        """The agents a child turn may be run in."""
        ...

    async def run_child_turn(
        self, parent: ToolContext, agent: str, task: str
    ) -> tuple[str, TurnResult]:
        """Run (or, on a replay, find) the child turn of ``parent``'s call in ``agent``
        with ``task`` as its opening; the child's session id and how it ended."""
        ...


def make_idempotency_key(
    *, store_id: str, session_id: str, generation: int, turn_id: str, step_id: str
) -> str:
    """Stable for one call across replays, restarts and processes; different for every
    other call, turn, session, generation of a session (a reset may reuse a turn id)
    and store (two stores may hold the same session ids)."""
    where = json.dumps([store_id, session_id, generation, turn_id, step_id])
    return f"tk-{hashlib.sha256(where.encode()).hexdigest()[:40]}"


@quick_init
@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What the engine hands a tool's ``run`` besides the model's input.

    ``store`` joins the step's transaction in a local tool; ``idempotency_key``
    is what a remote tool passes to a remote service so a replayed call is
    deduplicated there. ``generation`` is the session's (how many resets it has
    seen) and ``store_id`` the store's identity; both go into the key.
    """

    store: StoreHandle
    agent: AgentInfo
    session_id: str
    turn_id: str
    call_id: str
    event: InboundEvent | None
    #: Runs child turns in the runtime's other agents (``None`` outside a runtime).
    children: ChildTurns | None
    step_id: str
    generation: int
    store_id: str
    tool_name: str = ""
    #: The source whose policy the turn runs under (its channel's), or ``None``.
    source: str | None = None
    #: The tools the turn's policy denies (a subagent passes them on to its child).
    denied_tools: frozenset[str] = frozenset()
    #: Whose turn this is (``TurnRecord.tenant``); a subagent's child turn is the
    #: same tenant's, so it lives, spends and moves with its parent.
    tenant: str = ""
    #: The turn's memoized steps, where a resume stored the answers.
    _steps: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: True while a plain-``def`` tool runs inside the step's transaction.
    _local: bool = field(default=False, repr=False)
    #: Commits one of this call's notes (``remember``); ``None`` outside a delivery.
    _note: Callable[[str, Any], Awaitable[None]] | None = field(default=None, repr=False)
    #: How many clock waits (``sleep``) this run of the tool has made so far: the
    #: n-th wait of a call has the same id in every replay.
    _waits: list[int] = field(default_factory=lambda: [0], repr=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across replays of this call; pass it to remote services to dedupe on."""
        return make_idempotency_key(
            store_id=self.store_id,
            session_id=self.session_id,
            generation=self.generation,
            turn_id=self.turn_id,
            step_id=self.step_id,
        )

    def recall(self, key: str) -> Any:
        """What this call stored under ``key`` with ``remember``, in this delivery or
        an earlier one of the same turn; ``None`` if nothing was."""
        _check_note_key(key)
        return self._steps.get(note_step_id(self.step_id, key))

    async def remember(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON) with this call, durably, now, before the call returns.

        For a remote tool that starts work elsewhere and then waits for it: keep the
        handle (a remote task id) before waiting, and a replay of the call (after a
        crash, a takeover, a resume) reads it back with ``recall(key)`` and follows
        the same work instead of starting it again. A key holds one value: storing
        another under it fails the turn (``FatalToolError``); the same again is a
        no-op. Only an ``async def`` tool can remember (a plain ``def`` one already
        commits with its step)."""
        _check_note_key(key)
        if self._local or self._note is None:
            raise FatalToolError(
                f"tool {self.tool_name!r} called ctx.remember, which needs an async tool run "
                "by a turn (a plain def commits with its step)"
            )
        held = self.recall(key)
        if held is not None:
            if held != value:
                raise FatalToolError(
                    f"ctx.remember({key!r}): this call already remembered {held!r} under it"
                )
            return
        await self._note(note_step_id(self.step_id, key), value)

    def request_input(
        self,
        id: str,
        prompt: str,
        schema: dict[str, Any] | None = None,
        answerers: Answerer | Sequence[Answerer] | None = None,
        *,
        expires_in: timedelta | float | None = None,
        on_expiry: Any = None,
        remind_every: timedelta | float | None = None,
    ) -> Awaitable[Any]:
        """Park the turn until a person answers, then return the answer.

        The first time, the turn is checkpointed as ``suspended`` and this tool stops
        here. ``session.resume(...)`` stores the answer and replays the turn: the tool
        runs again from the top and this call returns the answer, so any work
        before it runs twice; put side effects after it. ``answerers`` says who may
        answer (default: the turn's speaker, if the platform attested them).

        ``expires_in`` gives the question a deadline; ``on_expiry`` says what happens
        when it passes unanswered: ``"cancel"`` or ``"fail"`` ends the turn, any other
        value is the answer the turn resumes with (recorded as given by
        ``"deadline"``; ``Expiry(action="answer", value="cancel")`` answers with the
        string itself). ``remind_every`` announces an ``input.reminder`` that often
        until it is answered. See docs/approvals.md.
        """
        if self._local:
            raise FatalToolError(
                f"tool {self.tool_name!r} called ctx.request_input, which parks the turn and "
                "needs an async tool: declare it with `async def` (a plain def runs inside "
                "the step's transaction and cannot wait for a person)"
            )
        return self._request_input(
            id, prompt, schema, answerers, expires_in, on_expiry, remind_every
        )

    async def _request_input(
        self,
        input_id: str,
        prompt: str,
        schema: dict[str, Any] | None,
        answerers: Answerer | Sequence[Answerer] | None,
        expires_in: timedelta | float | None = None,
        on_expiry: Any = None,
        remind_every: timedelta | float | None = None,
    ) -> Any:
        if not isinstance(input_id, str) or not input_id:
            raise FatalToolError(f"ctx.request_input: id must be a non-empty str, got {input_id!r}")
        if not isinstance(prompt, str):
            raise FatalToolError(f"ctx.request_input: prompt must be a str, got {prompt!r}")
        answer = self._answer(input_id)
        if answer is not None:
            if answer.expired == "fail":
                raise FatalToolError(
                    f"input {input_id!r} of tool {self.tool_name!r} was not answered by its "
                    "deadline, and its on_expiry fails the turn"
                )
            return answer.value
        where = f"ctx.request_input({input_id!r})"
        try:
            if schema is not None:
                check_schema(schema)
            who = as_answerers(answerers)
        except TypeError as exc:
            raise FatalToolError(f"{where}: {exc}") from None
        if who is None:
            who = self._default_answerers(input_id)
        now = time.time()
        expires = None if expires_in is None else now + _seconds(expires_in, where, "expires_in")
        expiry = _expiry(on_expiry, schema, where) if expires is not None else None
        if on_expiry is not None and expires is None:
            raise FatalToolError(f"{where}: on_expiry needs expires_in (a deadline)")
        every = None if remind_every is None else _seconds(remind_every, where, "remind_every")
        remind_at = reminder_before_deadline(None if every is None else now + every, expires)
        raise TurnParked(
            InputRequest(
                id=input_id,
                prompt=prompt,
                turn_id=self.turn_id,
                call_id=self.call_id,
                tool=self.tool_name,
                schema=schema,
                answerers=who,
                expires_at=expires,
                on_expiry=expiry,
                remind_every=every,
                remind_at=remind_at,
                asked_at=now,
            )
        )

    def _answer(self, input_id: str) -> InputAnswer | None:
        """The stored answer to this call's request ``input_id``, if a resume gave one."""
        # An answer to this call alone (several calls asked with this id) comes first.
        answer = self._steps.get(
            input_step_id(self.turn_id, call_input_id(input_id, self.call_id))
        ) or self._steps.get(input_step_id(self.turn_id, input_id))
        return None if answer is None else InputAnswer.from_dict(answer)

    async def sleep(self, duration: timedelta | float) -> None:
        """Wait ``duration`` (a ``timedelta`` or seconds) durably: the turn parks on a
        timer, nothing is held in memory, and any process serving the store resumes
        it when the time has come (or earlier, on ``session.wake``). The tool runs
        again from the top then, as after an answer, and this call returns at once."""
        where = "ctx.sleep"
        await self._wait_until(time.time() + _seconds(duration, where, "duration"), where)

    async def sleep_until(self, when: datetime) -> None:
        """``sleep`` until ``when``, a timezone-aware datetime; one in the past
        returns at once (after a durable park like any other)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise FatalToolError(f"ctx.sleep_until needs a timezone-aware datetime, got {when!r}")
        await self._wait_until(when.timestamp(), "ctx.sleep_until")

    async def _wait_until(self, at: float, where: str) -> None:
        if self._local:
            raise FatalToolError(
                f"tool {self.tool_name!r} called {where}, which parks the turn and needs an "
                "async tool: declare it with `async def`"
            )
        n = self._waits[0]
        self._waits[0] = n + 1
        timer_id = f"sleep:{self.step_id}:{n}"
        if self._answer(timer_id) is not None:
            return
        raise TurnParked(timer_request(self, timer_id, at, f"sleeping until {_iso(at)}"))

    def _default_answerers(self, input_id: str) -> tuple[Answerer, ...]:
        if self.event is None:
            return ()  # a programmatic or proactive turn: no speaker to restrict to
        user = self.event.user
        if user is not None and user.attested:
            return (Answerers.user(user.id),)
        raise FatalToolError(
            f"ctx.request_input({input_id!r}): the turn's speaker is not attested by the "
            f"{self.event.source!r} channel, so nobody can be trusted as its answerer; name "
            "one with answerers=Answerers.user(...) or Answerers.policy(...)"
        )


def _check_note_key(key: str) -> None:
    if not isinstance(key, str) or not key or ":" in key or not key.isprintable():
        raise FatalToolError(
            f"a note's key must be a non-empty printable str without ':', got {key!r}"
        )


def timer_request(ctx: ToolContext, timer_id: str, at: float, prompt: str) -> InputRequest:
    """A wait on the clock alone, asked by ``ctx``'s call: it ends at ``at``."""
    return InputRequest(
        id=timer_id,
        prompt=prompt,
        turn_id=ctx.turn_id,
        call_id=ctx.call_id,
        tool=ctx.tool_name,
        kind="timer",
        expires_at=at,
        on_expiry=Expiry(action="answer", value=None),
        asked_at=time.time(),
    )


def _seconds(value: object, where: str, name: str) -> float:
    """A duration as seconds: a ``timedelta`` or a number, more than zero."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise FatalToolError(f"{where}: {name} must be a timedelta or seconds, got {value!r}")
    if not seconds > 0 or seconds == float("inf"):
        raise FatalToolError(f"{where}: {name} must be more than zero, got {value!r}")
    return seconds


def _expiry(on_expiry: Any, schema: dict[str, Any] | None, where: str) -> Expiry:
    """``request_input``'s ``on_expiry`` as an ``Expiry``; a default answer must be
    JSON and meet the request's schema, checked now rather than at the deadline."""
    if on_expiry is None:
        raise FatalToolError(
            f"{where}: a deadline needs on_expiry: 'cancel', 'fail' or the answer to use"
        )
    if isinstance(on_expiry, Expiry):
        expiry = on_expiry
    elif on_expiry in ("cancel", "fail"):
        expiry = Expiry(action=on_expiry)
    else:
        expiry = Expiry(action="answer", value=on_expiry)
    if expiry.action == "answer":
        try:
            json.dumps(expiry.value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise FatalToolError(f"{where}: on_expiry's answer is not JSON: {exc}") from None
        if schema is not None:
            errors = sorted(
                jsonschema.validators.validator_for(schema)(schema).iter_errors(expiry.value),
                key=str,
            )
            if errors:
                raise FatalToolError(
                    f"{where}: on_expiry's answer does not meet the schema: {errors[0].message}"
                )
    return expiry


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")


class TurnParked(BaseException):
    """Internal: ``request_input`` stops the tool so the engine can park the turn.

    A ``BaseException``, so a tool's ``except Exception`` does not swallow it.
    """

    def __init__(self, request: InputRequest) -> None:
        super().__init__(request.id)
        self.request = request
