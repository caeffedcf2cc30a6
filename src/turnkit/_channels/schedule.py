"""Proactive turns on a schedule: ``ScheduledTurn`` entries and the ``schedule`` loop.

Each entry names a *slot* series (every N minutes, or at given times of day in a
time zone). Firing a slot runs ``receive(channel, ctx, ...)`` with a turn id derived
from the entry's name and the slot's instant, so a restart, a catch-up or a second
process delivers the same turn again instead of opening another one. Standard
library only: asyncio, datetime, hashlib, zoneinfo.

Example::

    from datetime import time

    digest = ScheduledTurn(
        name="morning-digest",
        seed="Summarize what happened overnight.",
        session="ops",
        target="#ops",
        at=time(9, 0),
        tz="Europe/Paris",
    )
    await schedule(channel, mount_agent(agent, runtime), digest)  # runs until cancelled
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime, time, timedelta, tzinfo
from typing import Any, NoReturn, Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .._errors import ConfigurationError
from .._seams.election import ElectingStore, Election
from .._values.inbound import Proactive
from .channel import Channel, ChannelContext, receive

log = logging.getLogger("turnkit.schedule")

#: Where ``every=`` slots are counted from unless ``start=`` says otherwise, so that
#: ``every=timedelta(hours=1)`` fires on the hour (UTC).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The longest single sleep: a long wait is cut into pieces so that a wall-clock
#: change (a suspended laptop, an NTP step) is noticed within this many seconds.
MAX_SLEEP = 60.0
_MIN_EVERY = timedelta(seconds=1)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _is_aware(value: datetime) -> bool:
    return value.tzinfo is not None and value.utcoffset() is not None


@runtime_checkable
class SlotRule(Protocol):
    """When an entry's slots are: what ``ScheduledTurn(slots=...)`` takes.

    Both methods get and return timezone-aware datetimes; they must be pure
    functions of their argument, so every process computes the same slots.
    """

    def latest_slot(self, now: datetime) -> datetime | None:
        """The last slot at or before ``now``, or ``None`` if there is none yet."""
        ...

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after ``after``."""
        ...


class ScheduledTurn:
    """One proactive turn to run on a schedule: ``every`` interval or daily ``at`` times.

    ``name`` identifies the entry: together with a slot's instant it derives the
    slot's turn id (``turn_id(slot)``), so keep it stable across deployments.
    ``seed`` is the trigger message's text, ``session`` the session the turn runs
    on and ``target`` what the channel's ``deliver`` renders to. ``by`` names the
    trigger in the transcript (default ``"schedule:<name>"``).

    Give exactly one of:

    - ``every=timedelta(...)`` (at least one second): slots at ``start + k * every``
      in elapsed time; ``start`` (a timezone-aware datetime) defaults to the Unix
      epoch, so hourly slots fall on the hour UTC.
    - ``at=time(...)`` or a list of them (naive times): every day at those wall-clock
      times in ``tz`` (an IANA name or a ``ZoneInfo``, default ``"UTC"``). A time
      that a daylight-saving change skips fires at the instant it maps to, once.
    - ``slots=`` any ``SlotRule`` (``latest_slot(now)`` and ``next_slot(after)``),
      such as ``turnkit.cron.cron("0 9 * * MON-FRI", tz=...)`` (extra ``turnkit[cron]``).

    Every mistake is a ``ConfigurationError`` naming the field.
    """

    __slots__ = (
        "at",
        "by",
        "every",
        "name",
        "seed",
        "session",
        "slots",
        "start",
        "target",
        "tz",
    )

    def __init__(
        self,
        *,
        name: str,
        seed: str,
        session: str,
        target: Any = None,
        every: timedelta | None = None,
        start: datetime | None = None,
        at: time | Sequence[time] | None = None,
        tz: str | tzinfo | None = None,
        slots: SlotRule | None = None,
        by: str | None = None,
    ) -> None:
        self.name: str = _text("name", name)
        self.seed: str = _text("seed", seed, who=self.name)
        self.session: str = _text("session", session, who=self.name)
        self.target: Any = target
        if [every, at, slots].count(None) != 2:
            raise ConfigurationError(
                f"ScheduledTurn {self.name!r}: give exactly one of every= (an interval), "
                "at= (times of day) or slots= (a SlotRule)"
            )
        self.every: timedelta | None = None
        self.start: datetime | None = None
        self.at: tuple[time, ...] = ()
        self.tz: tzinfo = UTC
        self.slots: SlotRule | None = None
        if slots is not None:
            if not all(callable(getattr(slots, m, None)) for m in ("latest_slot", "next_slot")):
                raise ConfigurationError(
                    f"ScheduledTurn {self.name!r}: slots must have latest_slot(now) and "
                    f"next_slot(after) methods, got {slots!r}"
                )
            for option, value in (("start", start), ("tz", tz)):
                if value is not None:
                    raise ConfigurationError(
                        f"ScheduledTurn {self.name!r}: {option}= does not apply to slots="
                    )
            self.slots = slots
        elif every is not None:
            self.every = _interval(self.name, every)
            self.start = _start(self.name, start)
            if tz is not None:
                raise ConfigurationError(
                    f"ScheduledTurn {self.name!r}: tz= applies to at= times only; "
                    "give start= a timezone to shift an interval"
                )
        else:
            if start is not None:
                raise ConfigurationError(
                    f"ScheduledTurn {self.name!r}: start= applies to every= only"
                )
            self.at = _times(self.name, at)
            self.tz = _zone(self.name, tz)
        chosen = by if by is not None else f"schedule:{self.name}"
        try:
            Proactive(by=chosen)
        except ValueError:
            raise ConfigurationError(
                f"ScheduledTurn {self.name!r}: by must be a non-empty str, got {by!r}"
            ) from None
        self.by: str = chosen

    def __repr__(self) -> str:
        if self.slots is not None:
            when = f"slots={self.slots!r}"
        elif self.every is not None:
            when = f"every={self.every!r}, start={self.start!r}"
        else:
            when = f"at={list(self.at)!r}, tz={str(self.tz)!r}"
        return (
            f"ScheduledTurn(name={self.name!r}, session={self.session!r}, "
            f"target={self.target!r}, {when}, by={self.by!r})"
        )

    # -- slots ---------------------------------------------------------------------

    def latest_slot(self, now: datetime) -> datetime | None:
        """The last slot at or before ``now`` (UTC), or ``None`` if there is none yet."""
        now = _aware("now", now)
        if self.slots is not None:
            slot = self.slots.latest_slot(now)
            if slot is None:
                return None
            if not isinstance(slot, datetime) or not _is_aware(slot) or slot > now:
                raise ConfigurationError(
                    f"ScheduledTurn {self.name!r}: slots.latest_slot({now.isoformat()}) "
                    f"returned {slot!r}; it must be None or a timezone-aware datetime at "
                    "or before now"
                )
            return slot.astimezone(UTC)
        if self.every is not None:
            start = self.start or EPOCH
            if now < start:
                return None
            return start + ((now - start) // self.every) * self.every
        earlier = [slot for slot in self._daily_around(now) if slot <= now]
        return earlier[-1]

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after ``after`` (UTC)."""
        after = _aware("after", after)
        if self.slots is not None:
            slot = self.slots.next_slot(after)
            if not isinstance(slot, datetime) or not _is_aware(slot) or slot <= after:
                raise ConfigurationError(
                    f"ScheduledTurn {self.name!r}: slots.next_slot({after.isoformat()}) "
                    f"returned {slot!r}; it must be a timezone-aware datetime after it"
                )
            return slot.astimezone(UTC)
        if self.every is not None:
            start = self.start or EPOCH
            if after < start:
                return start
            return start + ((after - start) // self.every + 1) * self.every
        return next(slot for slot in self._daily_around(after) if slot > after)

    def _daily_around(self, moment: datetime) -> list[datetime]:
        """This entry's daily slots from two local days before ``moment`` to two after."""
        today = moment.astimezone(self.tz).date()
        slots = {
            datetime.combine(today + timedelta(days=offset), at, tzinfo=self.tz).astimezone(UTC)
            for offset in range(-2, 3)
            for at in self.at
        }
        return sorted(slots)

    def turn_id(self, slot: datetime) -> str:
        """The turn id of this entry's ``slot``: the same in every process, forever."""
        instant = _aware("slot", slot).astimezone(UTC).isoformat()
        digest = hashlib.sha256(f"turnkit.schedule\x00{self.name}\x00{instant}".encode())
        return digest.hexdigest()[:32]


def _text(field: str, value: object, *, who: str | None = None) -> str:
    if not isinstance(value, str) or not value.strip():
        where = f"ScheduledTurn {who!r}" if who is not None else "ScheduledTurn"
        raise ConfigurationError(f"{where}: {field} must be a non-empty str, got {value!r}")
    return value


def _interval(name: str, every: object) -> timedelta:
    if not isinstance(every, timedelta):
        raise ConfigurationError(
            f"ScheduledTurn {name!r}: every must be a datetime.timedelta, got {every!r}"
        )
    if every < _MIN_EVERY:
        raise ConfigurationError(
            f"ScheduledTurn {name!r}: every must be at least one second, got {every!r}"
        )
    return every


def _start(name: str, start: object) -> datetime | None:
    if start is None:
        return None
    if not isinstance(start, datetime) or not _is_aware(start):
        raise ConfigurationError(
            f"ScheduledTurn {name!r}: start must be a timezone-aware datetime, got {start!r}"
        )
    return start.astimezone(UTC)  # intervals count elapsed time, not wall-clock time


def _times(name: str, at: object) -> tuple[time, ...]:
    listed: list[object] = []
    if isinstance(at, time):
        listed = [at]
    elif isinstance(at, Sequence) and not isinstance(at, str | bytes):
        listed = list(at)
    if not listed:
        raise ConfigurationError(
            f"ScheduledTurn {name!r}: at must be a datetime.time or a non-empty list of them, "
            f"got {at!r}"
        )
    times: list[time] = []
    for value in listed:
        if not isinstance(value, time):
            raise ConfigurationError(
                f"ScheduledTurn {name!r}: at must hold datetime.time values, got {value!r}"
            )
        if value.tzinfo is not None:
            raise ConfigurationError(
                f"ScheduledTurn {name!r}: at times must be naive ({value!r} has a tzinfo); "
                "give the zone as tz="
            )
        if value in times:
            raise ConfigurationError(f"ScheduledTurn {name!r}: at lists {value} twice")
        times.append(value)
    return tuple(sorted(times))


def _zone(name: str, tz: object) -> tzinfo:
    if tz is None:
        return UTC
    if isinstance(tz, tzinfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(
            f"ScheduledTurn {name!r}: tz must be an IANA zone name or a tzinfo, got {tz!r}"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"ScheduledTurn {name!r}: tz {tz!r} is not a known IANA time zone "
            "(such as 'Europe/Paris')"
        ) from None


def _aware(field: str, value: object) -> datetime:
    if not isinstance(value, datetime) or not _is_aware(value):
        raise ConfigurationError(f"{field} must be a timezone-aware datetime, got {value!r}")
    return value


async def schedule(
    channel: Channel,
    ctx: ChannelContext,
    *entries: ScheduledTurn,
    clock: Callable[[], datetime] = _utc_now,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    catch_up: bool = True,
    elect: bool = True,
) -> NoReturn:
    """Fire each entry's slots through ``receive(channel, ctx, ...)`` until cancelled.

    Each slot's turn id is ``entry.turn_id(slot)``. Before firing, the store is
    asked for that turn: one that already ended (or is parked for input) is not
    fired again; one left ``running`` by a dead process is redelivered, so it
    finishes and is rendered. With ``catch_up`` (the default) each entry first
    fires its most recent slot at or before now, if that slot has no turn yet: at
    most one catch-up per entry, however many slots were missed.

    A firing that raises (a ``DeliveryError``, a store outage, a parked session) or
    a turn that fails is logged, and the entry goes on with its next slot; slots
    the clock passed while a firing ran are logged as missed and only the latest
    of them fires. ``clock`` (returning a timezone-aware datetime) and ``sleep``
    are injectable for tests; an exception from either ends the scheduler with it.

    On a store that holds elections (``PostgresStore``), with ``elect`` (the
    default), any number of processes may run the same schedule: one is elected
    (an advisory lock named after the entries) and fires; the others wait, and one
    of them takes over, catching up, when the leader's connection ends. On a store
    without elections run one scheduler per store: slot ids keep a second one from
    opening a second turn, but not from rendering the same turn twice.
    """
    _check_setup(channel, ctx, entries, clock, sleep, catch_up)
    if not isinstance(elect, bool):
        raise ConfigurationError(f"schedule: elect must be a bool, got {elect!r}")
    now = _aware("schedule: clock()", clock())
    for entry in entries:
        ctx.session(entry.session)  # an unknown or foreign session fails here, not later
    runner = _Runner(channel, ctx, clock, sleep)
    log.info(
        "schedule: %d entr%s on channel %r, starting %s%s",
        len(entries),
        "y" if len(entries) == 1 else "ies",
        channel.source,
        now.isoformat(),
        " (catching up)" if catch_up else "",
    )
    store = ctx.runtime.store
    if not elect or not isinstance(store, ElectingStore):
        await _fire_all(runner, entries, catch_up)
    name = "schedule:" + ",".join(sorted(entry.name for entry in entries))
    election = store.election(name)
    while True:
        log.info("schedule %s: standing for election (another process may lead)", name)
        # A process that takes over catches up: the slot a leader that died missed
        # fires if it has no turn yet.
        took_over = await election.lead()
        log.info("schedule %s: this process leads; firing", name)
        try:
            await _while_leading(election, _fire_all(runner, entries, catch_up or took_over))
        finally:
            await election.resign()
        log.warning("schedule %s: lost the lead; standing again", name)
        catch_up = True


async def _while_leading(election: Election, firing: Coroutine[Any, Any, NoReturn]) -> None:
    """Run ``firing`` until ``election`` is lost (then stop it and return); what
    ends ``firing`` (a clock or sleep failure) is raised."""
    fire = asyncio.ensure_future(firing)
    lost = asyncio.ensure_future(election.lost())
    try:
        await asyncio.wait({fire, lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (fire, lost):
            task.cancel()
        await asyncio.gather(fire, lost, return_exceptions=True)
    failure = fire.exception() if fire.done() and not fire.cancelled() else None
    if failure is not None:
        raise failure


async def _fire_all(runner: _Runner, entries: Sequence[ScheduledTurn], catch_up: bool) -> NoReturn:
    """Fire every entry's slots until cancelled, or until the clock or sleep fails."""
    tasks = [
        asyncio.create_task(runner.run(entry, catch_up), name=f"turnkit:schedule:{entry.name}")
        for entry in entries
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        ended = next(iter(done))
        ended.result()  # re-raises what ended it (a clock or sleep failure)
        raise AssertionError(f"schedule: task {ended.get_name()} returned")  # pragma: no cover
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _check_setup(
    channel: object,
    ctx: object,
    entries: Sequence[object],
    clock: object,
    sleep: object,
    catch_up: object,
) -> None:
    source = getattr(channel, "source", None)
    if not isinstance(source, str) or not source:
        raise ConfigurationError(f"schedule: channel {channel!r} has no source (a non-empty str)")
    if not callable(getattr(channel, "deliver", None)):
        raise ConfigurationError(
            f"schedule: channel {source!r} has no deliver(target, events), so it cannot "
            "render a scheduled turn"
        )
    if not isinstance(ctx, ChannelContext):
        raise ConfigurationError(
            f"schedule: ctx must be the ChannelContext from mount_agent, got {type(ctx).__name__}"
        )
    if not entries:
        raise ConfigurationError("schedule: give at least one ScheduledTurn entry")
    names: set[str] = set()
    for entry in entries:
        if not isinstance(entry, ScheduledTurn):
            raise ConfigurationError(f"schedule: entries must be ScheduledTurn, got {entry!r}")
        if entry.name in names:
            raise ConfigurationError(
                f"schedule: two entries are named {entry.name!r}; names derive turn ids, "
                "so they must be unique"
            )
        names.add(entry.name)
    if not callable(clock):
        raise ConfigurationError(f"schedule: clock must be callable, got {clock!r}")
    if not callable(sleep):
        raise ConfigurationError(f"schedule: sleep must be callable, got {sleep!r}")
    if not isinstance(catch_up, bool):
        raise ConfigurationError(f"schedule: catch_up must be a bool, got {catch_up!r}")


class _Runner:
    """Drives the entries' slots; one ``run`` task per entry."""

    def __init__(
        self,
        channel: Channel,
        ctx: ChannelContext,
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[object]],
    ) -> None:
        self.channel = channel
        self.ctx = ctx
        self.clock = clock
        self.sleep = sleep

    def now(self) -> datetime:
        return _aware("schedule: clock()", self.clock())

    async def run(self, entry: ScheduledTurn, catch_up: bool) -> None:
        now = self.now()
        latest = entry.latest_slot(now) if catch_up else None
        if latest is not None:
            await self.fire(entry, latest, catching_up=True)
            after = latest
        else:
            after = now - timedelta(microseconds=1)  # a slot due right now is not missed
        while True:
            slot = entry.next_slot(after)
            log.debug("schedule %r: next slot %s", entry.name, slot.isoformat())
            while (now := self.now()) < slot:
                await self.sleep(min((slot - now).total_seconds(), MAX_SLEEP))
            latest = entry.latest_slot(now)
            due = latest if latest is not None and latest > slot else slot
            if due > slot:
                log.warning(
                    "schedule %r: missed the slots from %s up to %s (the clock passed them "
                    "while the scheduler was busy or asleep); firing only the latest, %s",
                    entry.name,
                    slot.isoformat(),
                    due.isoformat(),
                    due.isoformat(),
                )
            await self.fire(entry, due)
            after = due

    async def fire(
        self, entry: ScheduledTurn, slot: datetime, *, catching_up: bool = False
    ) -> None:
        """Fire one slot unless its turn exists; log every outcome, raise nothing."""
        turn_id = entry.turn_id(slot)
        what = f"schedule {entry.name!r} slot {slot.isoformat()} (turn {turn_id})"
        try:
            record = await self.ctx.session(entry.session).turn_record(turn_id)
            if record is not None and record.status != "running":
                log.info("%s: already %s; not fired again", what, record.status)
                return
            if record is not None:
                log.warning("%s: an earlier delivery left it running; redelivering it", what)
            else:
                log.info("%s: firing%s", what, " (catch-up)" if catching_up else "")
            result = await receive(
                self.channel,
                self.ctx,
                seed=entry.seed,
                target=entry.target,
                trigger=Proactive(by=entry.by),
                session=entry.session,
                turn_id=turn_id,
            )
        except Exception as exc:
            log.error(
                "%s: firing failed (%s: %s); going on with the next slot",
                what,
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            return
        if result.status == "completed":
            log.info("%s: completed", what)
        elif result.status == "failed":
            log.error("%s: the turn failed: %s; going on with the next slot", what, result.error)
        elif result.status == "suspended":
            request = result.request.id if result.request is not None else "?"
            log.info("%s: the turn is waiting for input %r", what, request)
        else:
            log.warning("%s: the turn was cancelled (%s)", what, result.reason)
