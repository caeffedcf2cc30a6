"""``turnkit.cron``: cron expressions as schedule slots, across daylight-saving changes
and through the scheduler's catch-up."""

from __future__ import annotations

import importlib
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule import FakeTime, RecordingChannel, Stop

import turnkit
from turnkit import ConfigurationError, ScheduledTurn, schedule
from turnkit.cron import CronSlots, cron
from turnkit.stores import MemoryStore
from turnkit.testing import ScriptedModel

PARIS = ZoneInfo("Europe/Paris")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def slots(rule: CronSlots, after: datetime, count: int) -> list[datetime]:
    found: list[datetime] = []
    for _ in range(count):
        after = rule.next_slot(after)
        found.append(after)
    return found


def test_weekdays_at_nine_follow_the_local_clock_across_a_dst_change() -> None:
    rule = cron("0 9 * * MON-FRI", tz="Europe/Paris")
    # Thursday 26 March 2026, CET; the clocks go forward on Sunday the 29th.
    assert slots(rule, utc(2026, 3, 26, 12), 3) == [
        utc(2026, 3, 27, 8),  # Friday 09:00 CET
        utc(2026, 3, 30, 7),  # Monday 09:00 CEST: the weekend is skipped
        utc(2026, 3, 31, 7),
    ]
    assert all(s.astimezone(PARIS).hour == 9 for s in slots(rule, utc(2026, 10, 22), 6))


def test_a_time_the_clocks_skip_fires_once_where_it_maps() -> None:
    rule = cron("30 2 * * *", tz="Europe/Paris")
    # 02:30 does not exist on 29 March: it fires at the instant it maps to, 03:30 CEST.
    assert slots(rule, utc(2026, 3, 27, 12), 3) == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 30),
        utc(2026, 3, 30, 0, 30),
    ]
    assert utc(2026, 3, 29, 1, 30).astimezone(PARIS).hour == 3


def test_a_time_the_clocks_repeat_fires_once_at_its_first_occurrence() -> None:
    rule = cron("30 2 * * *", tz="Europe/Paris")
    # 02:30 happens twice on 25 October (CEST, then CET): it fires the first time only.
    assert slots(rule, utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]


def test_frequent_slots_around_both_changes_are_ordered_and_never_twice() -> None:
    rule = cron("*/30 * * * *", tz="Europe/Paris")
    spring = slots(rule, utc(2026, 3, 29, 0), 4)
    # 01:30 CET, then the skipped 02:00 and 02:30 land on 03:00 and 03:30 CEST, once.
    assert spring == [
        utc(2026, 3, 29, 0, 30),
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 29, 1, 30),
        utc(2026, 3, 29, 2, 0),
    ]
    autumn = slots(rule, utc(2026, 10, 25, 0), 3)
    # Wall-clock times fire once: the repeated 02:00 and 02:30 (CET) are not run again.
    assert autumn == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 2), utc(2026, 10, 25, 2, 30)]


ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
EXPRESSIONS = ["*/30 * * * *", "30 2 * * *", "0 9 * * MON-FRI", "15 1,2,3 * * SUN", "@daily"]


@settings(max_examples=150, deadline=None)
@given(
    moment=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31)),
    zone=st.sampled_from(ZONES),
    expression=st.sampled_from(EXPRESSIONS),
)
def test_latest_and_next_slot_agree(moment: datetime, zone: str, expression: str) -> None:
    rule = cron(expression, tz=zone)
    now = moment.replace(tzinfo=UTC)
    latest = rule.latest_slot(now)
    assert latest is not None and latest <= now
    upcoming = rule.next_slot(now)
    assert upcoming > now
    # No slot between them, and each is a slot of the other's walk.
    assert rule.next_slot(latest) == upcoming
    assert rule.latest_slot(upcoming) == upcoming
    assert rule.latest_slot(upcoming - timedelta(microseconds=1)) == latest


def test_a_slot_exactly_now_is_the_latest() -> None:
    rule = cron("0 9 * * *", tz="Europe/Paris")
    nine = utc(2026, 12, 3, 8)
    assert rule.latest_slot(nine) == nine
    assert rule.latest_slot(nine - timedelta(seconds=1)) == utc(2026, 12, 2, 8)
    assert rule.next_slot(nine) == utc(2026, 12, 4, 8)


async def test_the_scheduler_catches_up_one_cron_slot_and_goes_on() -> None:
    entry = ScheduledTurn(
        name="weekday-digest",
        seed="Summarize yesterday.",
        session="digest",
        target="#ops",
        slots=cron("0 9 * * MON-FRI", tz="Europe/Paris"),
    )
    agent = turnkit.Agent(name="ops", model=ScriptedModel(respond=lambda t: "ok"))
    channel = RecordingChannel()
    # Down since Friday: restarted on Tuesday 1 December 2026 at 14:20 Paris time.
    fake = FakeTime(utc(2026, 12, 1, 13, 20), until=utc(2026, 12, 3, 12))
    async with turnkit.Runtime([agent], store=MemoryStore()) as runtime:
        ctx = turnkit.mount_agent(agent, runtime)
        with pytest.raises(Stop):
            await schedule(channel, ctx, entry, clock=fake.clock, sleep=fake.sleep)
    fired = [utc(2026, 12, 1, 8), utc(2026, 12, 2, 8), utc(2026, 12, 3, 8)]
    # Tuesday 09:00 as the one catch-up (not Friday's nor Monday's), then each weekday.
    assert [r.turn_id for r in channel.rendered] == [entry.turn_id(s) for s in fired]


def test_mistakes_are_configuration_errors() -> None:
    for bad in ["", "0 9 * *", "0 9 * * * *", "61 * * * *", "0 0 31 2 *", "@reboot", "daily"]:
        with pytest.raises(ConfigurationError, match="is not a cron expression"):
            cron(bad)
    with pytest.raises(ConfigurationError, match="not a known IANA time zone"):
        cron("0 9 * * *", tz="Mars/Olympus")
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        cron("0 9 * * *").next_slot(datetime(2026, 1, 1))


def test_without_croniter_the_import_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "croniter", None)  # what an absent package looks like
    monkeypatch.delitem(sys.modules, "turnkit.cron")
    with pytest.raises(ImportError, match=r"pip install 'turnkit\[cron\]'"):
        importlib.import_module("turnkit.cron")
    monkeypatch.undo()
    assert importlib.import_module("turnkit.cron").cron is not None


def test_importing_turnkit_does_not_import_croniter() -> None:
    code = "import sys, turnkit, turnkit.cli; print('croniter' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
