"""What a delivery does with the turn it read (``_engine.delivery.course``): one
decision from the stored record's status, for every status and circumstance."""

from __future__ import annotations

from dataclasses import replace

import pytest

from turnkit import UserMessage
from turnkit._engine.delivery import Course, course
from turnkit._values.records import TurnRecord, TurnStatus

RECORD = TurnRecord(
    session_id="s",
    turn_id="t",
    agent="a",
    status="running",
    opening=UserMessage(text="hi", turn_id="t"),
)


def _course(
    status: TurnStatus | None,
    *,
    opened: bool = True,
    cancel: str | None = None,
    held_by: str | None = None,
) -> Course:
    record = None if status is None else replace(RECORD, status=status, held_by=held_by)
    return course(record, opened=opened, version="v2", cancel=cancel)


@pytest.mark.parametrize(
    ("status", "opened", "cancel", "held_by", "expected"),
    [
        (None, False, None, None, "open"),  # new: its opening commit decides the rest
        (None, False, "requested", None, "open"),  # cancelled at the opening's boundary
        ("queued", False, None, None, "open"),
        ("queued", False, "replaced", None, "settle"),  # cancelled before it opened
        ("running", True, None, None, "run"),  # a delivery died under it
        ("running", True, "requested", None, "run"),  # stops at its next boundary
        ("running", False, None, None, "announce"),  # superseded by a later turn
        ("failed", True, None, None, "reopen"),
        ("failed", False, None, None, "announce"),
        ("suspended", True, None, None, "announce"),  # parked, no answer yet
        ("suspended", True, "expired", None, "cancel"),  # ends where it waits
        ("suspended", False, "expired", None, "announce"),  # superseded wins
        ("suspended", True, None, "v1", "run"),  # held by v1 only: v2 tries it
        ("suspended", True, None, "v1,v2", "announce"),  # v2 refused it too
        ("suspended", True, "requested", "v1", "cancel"),
        ("completed", True, None, None, "announce"),
        ("cancelled", True, None, None, "announce"),
        ("completed", True, "requested", None, "announce"),  # too late to cancel
    ],
)
def test_a_delivery_takes_one_course_from_the_stored_status(
    status: TurnStatus | None,
    opened: bool,
    cancel: str | None,
    held_by: str | None,
    expected: Course,
) -> None:
    assert _course(status, opened=opened, cancel=cancel, held_by=held_by) == expected
