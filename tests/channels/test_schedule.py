"""The scheduler: slots, their turn ids, restarts, catch-up, failures and configuration.

Time is injected: ``FakeTime.sleep`` moves the fake clock forward instead of waiting,
and raises ``Stop`` once the clock passes the test's horizon, which ends ``schedule``.
No test waits on a real clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from conftest import plant_open_turn

import turnkit
from turnkit import ConfigurationError, ModelError, TriggerMessage, TurnEvent
from turnkit._channels.schedule import ScheduledTurn, schedule
from turnkit.stores import MemoryStore, SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def at(hour: int, minute: int = 0, *, day: int = 3) -> datetime:
    return datetime(2026, 12, day, hour, minute, tzinfo=UTC)


class Stop(Exception):
    """Raised by the fake sleep once the clock passes the horizon."""


class FakeTime:
    """A clock that ``sleep`` moves forward. A sleep that would pass ``until`` waits
    until all ``entries`` got there (so every entry has fired what it had before the
    horizon), then raises ``Stop``."""

    def __init__(self, now: datetime, until: datetime, *, entries: int = 1) -> None:
        self.now = now
        self.until = until
        self.entries = entries
        self.arrived = 0
        self.everyone_there = asyncio.Event()

    def clock(self) -> datetime:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if self.now + timedelta(seconds=seconds) > self.until:
            self.arrived += 1
            if self.arrived >= self.entries:
                self.everyone_there.set()
            await self.everyone_there.wait()
            raise Stop
        self.now += timedelta(seconds=seconds)
        await asyncio.sleep(0)  # not a wait: a fake clock's sleep yields as a real one does


@dataclass
class Rendered:
    target: Any
    turn_id: str
    types: list[str]
    text: str | None


class RecordingChannel:
    """A channel whose ``deliver`` records what it rendered; the first ``fail``
    deliveries raise after reading the turn to its end."""

    source = "test"

    def __init__(self, *, fail: int = 0, during: Any = None) -> None:
        self.rendered: list[Rendered] = []
        self.fail = fail
        self.during = during

    def to_event(self, payload: Any) -> None:
        return None

    async def deliver(self, target: Any, events: AsyncIterator[TurnEvent]) -> None:
        seen = [event async for event in events]
        text = next((e.text for e in seen if e.type == "turn.completed"), None)
        self.rendered.append(Rendered(target, seen[0].turn_id, [e.type for e in seen], text))
        if self.during is not None:
            self.during()
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the platform is down")


def reporter(name: str = "ops") -> turnkit.Agent:
    return turnkit.Agent(
        name=name, model=ScriptedModel(respond=lambda m: f"report on: {m[-1].text}")
    )


def hourly(**overrides: Any) -> ScheduledTurn:
    options: dict[str, Any] = {
        "name": "hourly",
        "seed": "what changed this hour?",
        "session": "s1",
        "target": "#ops",
        "every": timedelta(hours=1),
    }
    options.update(overrides)
    return ScheduledTurn(**options)


async def run_until_stopped(
    channel: Any, ctx: turnkit.ChannelContext, fake: FakeTime, *entries: Any, **options: Any
) -> None:
    with pytest.raises(Stop):
        await schedule(channel, ctx, *entries, clock=fake.clock, sleep=fake.sleep, **options)


async def triggers(session: turnkit.AgentSession) -> list[TriggerMessage]:
    return [m for m in await session.messages() if isinstance(m, TriggerMessage)]


# -- slots and turn ids -----------------------------------------------------------------


async def test_slots_fire_in_order_with_deterministic_turn_ids(open_runtime: Any) -> None:
    agent = reporter()
    rt = await open_runtime(agent)
    channel = RecordingChannel()
    entry = hourly()
    fake = FakeTime(at(10, 30), until=at(13, 30))

    await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry, catch_up=False)

    slots = [at(11), at(12), at(13)]
    assert [r.turn_id for r in channel.rendered] == [entry.turn_id(s) for s in slots]
    assert all(r.target == "#ops" for r in channel.rendered)
    assert all(
        r.types[0] == "turn.started" and r.types[-1] == "turn.completed" for r in channel.rendered
    )
    assert {r.text for r in channel.rendered} == {"report on: what changed this hour?"}
    # The same name and slot give the same id in any process; the derivation is pinned.
    assert hourly(seed="other", session="s9").turn_id(at(11)) == entry.turn_id(at(11))
    assert entry.turn_id(at(11)) == "a6223b3046f4da6f8c059f62635870e0"
    assert entry.turn_id(datetime(2026, 12, 3, 12, tzinfo=ZoneInfo("Europe/Paris"))) == (
        entry.turn_id(at(11))
    )
    assert len({entry.turn_id(s) for s in slots}) == 3
    assert hourly(name="other").turn_id(at(11)) != entry.turn_id(at(11))


async def test_the_trigger_is_a_trigger_message_attributed_to_by(open_runtime: Any) -> None:
    agent = reporter()
    rt = await open_runtime(agent)
    ctx = turnkit.mount_agent(agent, rt)
    default, named = hourly(), hourly(name="digest", session="s2", by="cron:digest")
    fake = FakeTime(at(10, 30), until=at(11, 30), entries=2)

    await run_until_stopped(RecordingChannel(), ctx, fake, default, named, catch_up=False)

    first = await triggers(rt.session("ops", "s1"))
    second = await triggers(rt.session("ops", "s2"))
    assert first == [
        TriggerMessage(
            text="what changed this hour?", turn_id=default.turn_id(at(11)), by="schedule:hourly"
        )
    ]
    assert second == [
        TriggerMessage(
            text="what changed this hour?", turn_id=named.turn_id(at(11)), by="cron:digest"
        )
    ]


def test_interval_slots_count_from_start_or_the_epoch() -> None:
    entry = hourly()
    assert entry.latest_slot(at(10, 30)) == at(10)
    assert entry.latest_slot(at(10)) == at(10)
    assert entry.next_slot(at(10)) == at(11)
    assert entry.next_slot(at(10, 59)) == at(11)
    shifted = hourly(every=timedelta(minutes=90), start=at(9, 15))
    assert shifted.latest_slot(at(9)) is None
    assert shifted.next_slot(at(9)) == at(9, 15)
    assert shifted.latest_slot(at(12)) == at(10, 45)
    assert shifted.next_slot(at(12)) == at(12, 15)


def test_daily_slots_follow_the_zone_across_daylight_saving() -> None:
    paris = ZoneInfo("Europe/Paris")
    entry = hourly(every=None, at=[time(17), time(9)], tz="Europe/Paris")
    assert entry.at == (time(9), time(17))
    # Winter: Paris is UTC+1.
    assert entry.next_slot(at(7)) == at(8)
    assert entry.next_slot(at(8)) == at(16)
    assert entry.next_slot(at(16)) == at(8, day=4)
    assert entry.latest_slot(at(7)) == at(16, day=2)
    # 29 March 2026 the clocks go forward: 09:00 in Paris is 07:00 UTC from then on.
    saturday = datetime(2026, 3, 28, 12, tzinfo=UTC)
    assert entry.next_slot(saturday) == datetime(2026, 3, 28, 16, tzinfo=UTC)
    sunday = entry.next_slot(datetime(2026, 3, 28, 16, tzinfo=UTC))
    assert sunday == datetime(2026, 3, 29, 7, tzinfo=UTC)
    assert sunday.astimezone(paris).hour == 9
    # A time the change skips (02:30) fires once, at the instant it maps to.
    gap = hourly(every=None, at=[time(2, 30), time(3, 30)], tz=paris)
    fired = gap.next_slot(datetime(2026, 3, 28, 23, tzinfo=UTC))
    assert fired == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert gap.next_slot(fired) == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)


async def test_daily_slots_fire_through_the_scheduler() -> None:
    agent = reporter()
    channel = RecordingChannel()
    entry = hourly(name="twice-daily", every=None, at=[time(9), time(17)], tz="Europe/Paris")
    fake = FakeTime(at(7), until=at(9, day=4))
    async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
        await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry)
    slots = [at(16, day=2), at(8), at(16), at(8, day=4)]  # the first one is the catch-up
    assert [r.turn_id for r in channel.rendered] == [entry.turn_id(s) for s in slots]


class Weekdays:
    """A ``SlotRule`` of our own: 09:00 UTC, Monday to Friday."""

    def slots_around(self, moment: datetime) -> list[datetime]:
        days = [moment.date() + timedelta(days=d) for d in range(-4, 5)]
        return [datetime.combine(d, time(9), tzinfo=UTC) for d in days if d.weekday() < 5]

    def latest_slot(self, now: datetime) -> datetime | None:
        return [s for s in self.slots_around(now) if s <= now][-1]

    def next_slot(self, after: datetime) -> datetime:
        return next(s for s in self.slots_around(after) if s > after)


class Broken:
    def __init__(self, latest: Any, following: Any) -> None:
        self.latest, self.following = latest, following

    def latest_slot(self, now: datetime) -> Any:
        return self.latest

    def next_slot(self, after: datetime) -> Any:
        return self.following


async def test_a_slot_rule_of_ones_own_drives_the_scheduler(open_runtime: Any) -> None:
    agent = reporter()
    rt = await open_runtime(agent)
    channel = RecordingChannel()
    entry = hourly(name="weekdays", every=None, slots=Weekdays())
    # Friday 4 December 10:00 to Tuesday 8 December 10:00.
    fake = FakeTime(at(10, day=4), until=at(10, day=8))
    await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry)
    days = [at(9, day=d) for d in (4, 7, 8)]  # Friday's is the catch-up; no weekend
    assert [r.turn_id for r in channel.rendered] == [entry.turn_id(d) for d in days]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (Broken(datetime(2026, 12, 3, 9), at(11)), "latest_slot.* it must be None or a timezone"),
        (Broken(at(11), at(11)), "latest_slot.* at or before now"),
        (
            Broken(None, at(10)),
            "next_slot.* returned .*; it must be a timezone-aware datetime after",
        ),
        (Broken(None, "11:00"), "next_slot.* returned '11:00'"),
    ],
)
async def test_a_slot_rule_that_breaks_its_contract_stops_the_scheduler(
    rule: Broken, message: str
) -> None:
    agent = reporter()
    entry = hourly(name="broken", every=None, slots=rule)
    async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
        fake = FakeTime(at(10, 30), until=at(12))
        with pytest.raises(ConfigurationError, match=f"ScheduledTurn 'broken': slots.{message}"):
            await schedule(
                RecordingChannel(),
                turnkit.mount_agent(agent, rt),
                entry,
                clock=fake.clock,
                sleep=fake.sleep,
            )


# -- durability ---------------------------------------------------------------------------


async def test_a_restart_does_not_refire_a_finished_slot_and_catches_up_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "schedule.db"
    entry = hourly()

    async def process(now: datetime, until: datetime) -> tuple[list[str], list[TriggerMessage]]:
        """One scheduler process: a fresh runtime, store object and model on ``db``."""
        agent = reporter()
        channel = RecordingChannel()
        async with turnkit.Runtime([agent], store=SqliteStore(db)) as rt:
            fake = FakeTime(now, until)
            await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry)
            return [r.turn_id for r in channel.rendered], await triggers(rt.session("ops", "s1"))

    # First process: catches up on 10:00 at startup, then fires 11:00.
    rendered, stored = await process(at(10, 30), until=at(11, 30))
    assert rendered == [entry.turn_id(at(10)), entry.turn_id(at(11))]
    assert [t.turn_id for t in stored] == rendered

    # Restarted at 11:45: the latest slot (11:00) already ran, so nothing fires.
    caplog.set_level(logging.INFO, logger="turnkit.schedule")
    rendered, stored = await process(at(11, 45), until=at(11, 50))
    assert rendered == []
    assert len(stored) == 2
    assert f"(turn {entry.turn_id(at(11))}): already completed; not fired again" in caplog.text

    # Down from 11:50 to 14:20: 12:00, 13:00 and 14:00 were missed; only 14:00 fires.
    rendered, stored = await process(at(14, 20), until=at(14, 50))
    assert rendered == [entry.turn_id(at(14))]
    assert [t.turn_id for t in stored] == [entry.turn_id(s) for s in (at(10), at(11), at(14))]


async def test_a_slot_left_running_by_a_dead_process_is_redelivered_not_reopened(
    tmp_path: Path,
) -> None:
    db = tmp_path / "schedule.db"
    entry = hourly()
    tid = entry.turn_id(at(10))
    await plant_open_turn(db, session_id="s1", turn_id=tid, agent="ops", text="planted")
    agent = reporter()
    channel = RecordingChannel()
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as rt:
        fake = FakeTime(at(10, 30), until=at(10, 40))
        await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry)
        session = rt.session("ops", "s1")
        assert (await session.result(tid)).text == "report on: planted"
        openings = [m for m in await session.messages() if m.role in ("user", "trigger")]
    assert [r.turn_id for r in channel.rendered] == [tid]
    assert [m.turn_id for m in openings] == [tid]  # one turn, the planted one


async def test_without_catch_up_missed_slots_are_not_fired(open_runtime: Any) -> None:
    agent = reporter()
    rt = await open_runtime(agent)
    channel = RecordingChannel()
    entry = hourly()
    fake = FakeTime(at(10, 30), until=at(10, 59))
    await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry, catch_up=False)
    assert channel.rendered == []
    # A slot due exactly at startup is not missed, though.
    fake = FakeTime(at(11), until=at(11, 30))
    await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry, catch_up=False)
    assert [r.turn_id for r in channel.rendered] == [entry.turn_id(at(11))]


# -- failures -----------------------------------------------------------------------------


async def test_a_failing_deliver_is_logged_and_the_next_slot_still_fires(
    open_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    agent = reporter()
    rt = await open_runtime(agent)
    channel = RecordingChannel(fail=1)
    entry = hourly()
    fake = FakeTime(at(10, 30), until=at(12, 30))

    await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry, catch_up=False)

    first, second = entry.turn_id(at(11)), entry.turn_id(at(12))
    assert [r.turn_id for r in channel.rendered] == [first, second]
    errors = [
        r for r in caplog.records if r.name == "turnkit.schedule" and r.levelno == logging.ERROR
    ]
    assert len(errors) == 1
    message = errors[0].getMessage()
    assert f"(turn {first}): firing failed (DeliveryError:" in message
    assert "going on with the next slot" in message
    # The turn itself ran to its end; only its rendering failed.
    session = rt.session("ops", "s1")
    assert (await session.result(first)).status == "completed"
    assert (await session.result(second)).status == "completed"


async def test_a_failed_turn_is_logged_and_the_next_slot_still_fires(
    open_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    agent = turnkit.Agent(name="ops", model=ScriptedModel([ModelError("provider down"), "fine"]))
    rt = await open_runtime(agent)
    channel = RecordingChannel()
    entry = hourly()
    fake = FakeTime(at(10, 30), until=at(12, 30))

    await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry, catch_up=False)

    assert [r.types[-1] for r in channel.rendered] == ["turn.failed", "turn.completed"]
    assert channel.rendered[1].text == "fine"
    failed = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(
        f"(turn {entry.turn_id(at(11))}): the turn failed: " in m and "provider down" in m
        for m in failed
    )


async def test_slots_passed_during_a_slow_firing_are_logged_and_only_the_latest_fires(
    open_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    agent = reporter()
    rt = await open_runtime(agent)
    fake = FakeTime(at(10, 30), until=at(14, 30))
    slow = [True]

    def first_delivery_takes_three_hours() -> None:
        if slow.pop() if slow else False:
            fake.now += timedelta(hours=3)

    channel = RecordingChannel(during=first_delivery_takes_three_hours)
    entry = hourly()
    await run_until_stopped(channel, turnkit.mount_agent(agent, rt), fake, entry, catch_up=False)

    # 11:00 fired and took until 14:00; 12:00 and 13:00 were missed, 14:00 fired.
    assert [r.turn_id for r in channel.rendered] == [entry.turn_id(at(11)), entry.turn_id(at(14))]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "missed the slots from 2026-12-03T12:00:00+00:00 up to 2026-12-03T14:00:00+00:00" in w
        for w in warnings
    )


async def test_a_parked_slot_is_not_refired_and_a_parked_session_skips_the_next(
    open_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    @turnkit.tool
    async def approve(ctx: turnkit.ToolContext) -> str:
        """Ask a lead before sending the report."""
        answer = await ctx.request_input("send", "Send the report?", schema={"type": "boolean"})
        return "sent" if answer else "held"

    def respond(messages: Any) -> Any:
        if messages[-1].role == "trigger":
            return ScriptedReply(tool_calls=[tool_call("approve")])
        return "done"

    agent = turnkit.Agent(name="ops", model=ScriptedModel(respond=respond), tools=[approve])
    rt = await open_runtime(agent)
    caplog.set_level(logging.INFO, logger="turnkit.schedule")
    channel = RecordingChannel()
    entry = hourly()
    ctx = turnkit.mount_agent(agent, rt)
    fake = FakeTime(at(10, 30), until=at(11, 30))

    await run_until_stopped(channel, ctx, fake, entry)

    parked, skipped = entry.turn_id(at(10)), entry.turn_id(at(11))
    # 10:00 (the catch-up) parked for input; 11:00 could not start on the parked session.
    assert [r.turn_id for r in channel.rendered] == [parked]
    assert channel.rendered[0].types[-1] == "input.requested"
    assert f"(turn {parked}): the turn is waiting for input 'send'" in caplog.text
    assert f"(turn {skipped}): firing failed (SessionSuspendedError:" in caplog.text
    # Restarted while still parked: the parked slot is not fired again.
    caplog.clear()
    await run_until_stopped(channel, ctx, FakeTime(at(10, 40), until=at(10, 50)), entry)
    assert len(channel.rendered) == 1
    assert f"(turn {parked}): already suspended; not fired again" in caplog.text


async def test_a_clock_without_a_timezone_is_a_configuration_error() -> None:
    agent = reporter()
    async with turnkit.Runtime([agent], store=MemoryStore()) as rt:
        with pytest.raises(ConfigurationError, match="clock\\(\\) must be a timezone-aware"):
            await schedule(
                RecordingChannel(),
                turnkit.mount_agent(agent, rt),
                hourly(),
                clock=lambda: datetime(2026, 12, 3, 10),
            )


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": ""}, "name must be a non-empty str"),
        ({"name": 7}, "name must be a non-empty str"),
        ({"seed": "  "}, "'hourly': seed must be a non-empty str"),
        ({"session": None}, "'hourly': session must be a non-empty str"),
        ({"every": None}, "give exactly one of every= .*, at= .* or slots="),
        ({"at": time(9)}, "give exactly one of every="),
        ({"every": None, "slots": "0 9 * * *"}, "slots must have latest_slot\\(now\\) and"),
        ({"every": None, "slots": Weekdays(), "tz": "UTC"}, "tz= does not apply to slots="),
        ({"every": None, "slots": Weekdays(), "start": at(9)}, "start= does not apply to slots="),
        ({"every": 3600}, "every must be a datetime.timedelta, got 3600"),
        ({"every": timedelta(0)}, "every must be at least one second"),
        ({"every": timedelta(milliseconds=10)}, "every must be at least one second"),
        ({"start": datetime(2026, 1, 1)}, "start must be a timezone-aware datetime"),
        ({"tz": "Europe/Paris"}, "tz= applies to at= times only"),
        ({"every": None, "at": []}, "at must be a datetime.time or a non-empty list"),
        ({"every": None, "at": "09:00"}, "at must be a datetime.time or a non-empty list"),
        ({"every": None, "at": [time(9), "17:00"]}, "at must hold datetime.time values"),
        ({"every": None, "at": [time(9, tzinfo=UTC)]}, "at times must be naive"),
        ({"every": None, "at": [time(9), time(9)]}, "at lists 09:00:00 twice"),
        ({"every": None, "at": time(9), "tz": "Mars/Olympus"}, "tz 'Mars/Olympus' is not a known"),
        ({"every": None, "at": time(9), "tz": 5}, "tz must be an IANA zone name or a tzinfo"),
        ({"every": None, "at": time(9), "start": at(9)}, "start= applies to every= only"),
        ({"by": ""}, "by must be a non-empty str"),
    ],
)
def test_bad_entries_name_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        hourly(**overrides)


def test_an_entry_accepts_any_tzinfo_and_says_what_it_is() -> None:
    entry = hourly(every=None, at=time(9), tz=timezone(timedelta(hours=2)))
    assert entry.next_slot(at(0)) == at(7)
    assert "at=[datetime.time(9, 0)]" in repr(entry) and "by='schedule:hourly'" in repr(entry)


async def test_bad_scheduler_setups_are_configuration_errors() -> None:
    agent = reporter()

    class Mute:
        source = "mute"

        def to_event(self, payload: Any) -> None:
            return None

    async with turnkit.Runtime([agent, reporter("other")], store=MemoryStore()) as rt:
        ctx = turnkit.mount_agent(agent, rt)
        channel = RecordingChannel()
        cases: list[tuple[Any, str]] = [
            (schedule(channel, ctx), "give at least one ScheduledTurn"),
            (schedule(channel, ctx, hourly(), hourly()), "two entries are named 'hourly'"),
            (schedule(channel, ctx, "hourly"), "entries must be ScheduledTurn"),  # type: ignore[arg-type]
            (schedule(Mute(), ctx, hourly()), "channel 'mute' has no deliver"),  # type: ignore[arg-type]
            (schedule(channel, rt, hourly()), "ctx must be the ChannelContext"),  # type: ignore[arg-type]
            (schedule(channel, ctx, hourly(), catch_up="yes"), "catch_up must be a bool"),  # type: ignore[arg-type]
            (schedule(channel, ctx, hourly(), clock=None), "clock must be callable"),  # type: ignore[arg-type]
        ]
        rt.session("other", "theirs")
        cases.append((schedule(channel, ctx, hourly(session="theirs")), "belongs to agent 'other'"))
        for call, message in cases:
            with pytest.raises(ConfigurationError, match=message):
                await call
