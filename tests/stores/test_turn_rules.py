"""The turn's state machine (``turnkit.stores.turn_rules``), tested once for every store:
the stores only apply the ``PutTurn`` writes these functions make."""

from __future__ import annotations

from dataclasses import replace
from itertools import product
from typing import get_args

import pytest

from turnkit import InputRequest, TurnMoveError, UserMessage
from turnkit._values.checkpoints import SuspendCheckpoint
from turnkit.stores import PutTurn, TurnRecord, TurnStatus, turn_rules

STATUSES: tuple[TurnStatus, ...] = get_args(TurnStatus)


def _checkpoint(*deadlines: float | None) -> SuspendCheckpoint:
    """A checkpoint on one question per deadline given (``None``: none)."""
    asked = tuple(
        InputRequest(
            id=f"q{n}", prompt="?", turn_id="t", call_id=f"c{n}", tool="ask", expires_at=at
        )
        for n, at in enumerate(deadlines or (None,))
    )
    return SuspendCheckpoint(
        request=asked[0], call_id="c0", opening_text="hi", event=None, policy=None, requests=asked
    )


def _record(status: TurnStatus, **kw: object) -> TurnRecord:
    return TurnRecord(
        session_id="s",
        turn_id="t",
        agent="a",
        status=status,
        opening=UserMessage(text="hi", turn_id="t"),
        **kw,  # type: ignore[arg-type]
    )


ALLOWED = {
    (None, "queued"),
    (None, "running"),
    ("queued", "running"),
    ("queued", "cancelled"),
    ("queued", "failed"),
    ("running", "suspended"),
    ("running", "completed"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("suspended", "running"),
    ("suspended", "suspended"),
    ("suspended", "failed"),
    ("suspended", "cancelled"),
    ("failed", "running"),
}


def test_every_move_is_allowed_or_refused_as_the_table_says() -> None:
    for current, status in product((None, *STATUSES), STATUSES):
        assert turn_rules.may_follow(current, status) == ((current, status) in ALLOWED)


@pytest.mark.parametrize(
    ("current", "status"),
    [(c, s) for c, s in product(STATUSES, STATUSES) if (c, s) not in ALLOWED],
)
def test_a_forbidden_move_is_refused_naming_both_statuses(
    current: TurnStatus, status: TurnStatus
) -> None:
    with pytest.raises(TurnMoveError, match=f"turn t cannot move from {current} to {status}"):
        turn_rules.move(_record(current), status)


def test_a_new_turn_starts_queued_or_running() -> None:
    for status in STATUSES:
        if status in ("queued", "running"):
            put = turn_rules.new_turn(_record(status), owner="alice")
            assert (put.expect, put.owner, put.record.status) == (None, "alice", status)
        else:
            with pytest.raises(TurnMoveError, match=f"not {status}"):
                turn_rules.new_turn(_record(status))


def test_a_new_turn_carries_nothing_of_a_later_state() -> None:
    stale = _record("running", pending=_checkpoint(), cancel_reason="requested", finished_at=3.0)
    put = turn_rules.new_turn(stale)
    assert (put.record.pending, put.record.cancel_reason, put.record.finished_at) == (
        None,
        None,
        None,
    )


def test_the_session_follows_its_turn_except_while_queued() -> None:
    after = turn_rules.session_status_after
    assert after(None, "queued") is None  # a submitted turn does not move its session
    assert after(None, "running") == "running"
    assert after("queued", "running") == "running"
    assert after("queued", "cancelled") is None  # settled without ever running
    assert after("queued", "failed") is None
    assert after("running", "suspended") == "suspended"
    assert after("suspended", "suspended") == "suspended"
    assert after("suspended", "running") == "running"
    for final in ("completed", "failed", "cancelled"):
        assert after("running", final) == "idle"
        assert after("suspended", final) == "idle"


def test_a_move_is_planned_from_the_status_it_read() -> None:
    put = turn_rules.move(_record("running"), "completed", text="done", now=12.5)
    assert isinstance(put, PutTurn)
    assert put.expect == "running" and put.session_status == "idle"
    assert (put.record.status, put.record.text, put.record.finished_at) == (
        "completed",
        "done",
        12.5,
    )


def test_only_a_parked_turn_keeps_its_checkpoint() -> None:
    checkpoint = _checkpoint(20.0, None, 10.0)
    parked = turn_rules.move(_record("running"), "suspended", pending=checkpoint)
    assert parked.record.pending == checkpoint
    assert parked.record.finished_at is None
    assert parked.record.wake_at == 10.0  # the earliest deadline of its open questions
    resumed = turn_rules.move(parked.record, "running", pending=_checkpoint(5.0))
    assert resumed.record.pending is None and resumed.expect == "suspended"
    assert resumed.record.wake_at is None
    untimed = turn_rules.move(_record("running"), "suspended", pending=_checkpoint(None))
    assert untimed.record.wake_at is None


def test_a_move_replaces_text_and_error_and_keeps_the_rest() -> None:
    failed = replace(_record("failed", error="boom", created_at=7.0), cancel_reason=None)
    again = turn_rules.move(failed, "running").record
    assert (again.error, again.text, again.finished_at) == (None, None, None)
    assert again.created_at == 7.0 and again.opening == failed.opening


def test_the_first_cancel_reason_counts() -> None:
    assert turn_rules.first_cancel_reason(None, "reset") == "reset"
    assert turn_rules.first_cancel_reason("requested", "reset") == "requested"
