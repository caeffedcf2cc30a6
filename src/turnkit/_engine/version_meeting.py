"""A delivery meeting a turn recorded under another agent version: check, decide,
and commit what was decided (the turn runs on under this version, migrated or not,
or is held parked), with the event that says so. See docs/deploying.md.
"""

from __future__ import annotations

from .._errors import ConfigurationError
from .._values.events import TurnHeldEvent, TurnVersionChangedEvent
from .._values.messages import ToolCall
from .._values.records import TurnRecord
from .._values.step_ids import rewrite_step_id
from .._values.turn_rules import move, restamp
from .._values.versions import Rewrite, VersionChange
from .._values.writes import PutStep, Write
from .delivery import Delivery, stored_turn
from .transitions import Planned
from .versioning import decide, problems, turn_calls


class Held(Exception):
    """The delivery refused the turn; it is held parked (committed already)."""


def meets_version(record: TurnRecord | None, version: str) -> bool:
    """Whether a delivery of ``version`` must check ``record`` before running it:
    the turn is held, or recorded under another version. A turn recorded before
    turns kept versions (``None``) runs on unchecked."""
    if record is None:
        return False
    if record.held_by is not None:
        return record.status == "suspended"
    return record.version is not None and record.version != version


async def plan_meeting(d: Delivery) -> Planned:
    """What a delivery of this agent's version does with its turn: check the turn's
    calls against this version, ask the agent's hook, and plan the commit. Raises
    nothing for a refusal: the plan holds the turn (``Planned.turn.held_by``)."""
    record = stored_turn(d)
    version = d.agent.turn_version
    calls, answered, failed = turn_calls(d.transcript, d.turn_id)
    owed = tuple(rewritten(d, c) for c in calls if c.id not in answered)
    if record.version == version:
        decision: str | Rewrite = "continue"  # held by another version, back on its own
        found: tuple[str, ...] = ()
    else:
        found = problems(d.tools, calls, answered, failed)
        change = VersionChange(
            session_id=d.session_id,
            turn_id=d.turn_id,
            agent=d.agent.name,
            from_version=record.version or "",
            to_version=version,
            calls=tuple(calls),
            owed=owed,
            problems=found,
        )
        decision = await decide(d.agent, change)
    if decision == "refuse":
        return _hold(d, record, found)
    rewrite = decision if isinstance(decision, Rewrite) else None
    put = (
        move(record, "running", version=version)
        if record.status != "running"
        else restamp(record, version)
    )
    writes: list[Write] = [put]
    if rewrite is not None:
        again = sorted(c for c in rewrite.calls if rewrite_step_id(d.turn_id, c) in d.steps)
        if again:
            raise ConfigurationError(
                f"agent {d.agent.name!r}: on_version_change rewrote calls {again} of turn "
                f"{d.turn_id}, which an earlier migration rewrote already"
            )
        writes += [
            PutStep(rewrite_step_id(d.turn_id, cid), d.turn_id, call.to_dict())
            for cid, call in rewrite.calls.items()
        ]
    event = TurnVersionChangedEvent(
        turn_id=d.turn_id,
        session_id=d.session_id,
        from_version=record.version,
        to_version=version,
        action="migrated" if rewrite is not None else "continued",
        rewritten=tuple(rewrite.calls) if rewrite is not None else (),
        seq=d.next_seq,
    )
    return Planned(writes, [event], turn=put.record)


def _hold(d: Delivery, record: TurnRecord, found: tuple[str, ...]) -> Planned:
    version = d.agent.turn_version
    reason = f"version {version} refused to run this turn (recorded under {record.version})"
    if found:
        reason += ": " + "; ".join(found)
    held = version if record.held_by is None else f"{record.held_by},{version}"
    put = move(record, "suspended", error=reason, held_by=held)
    event = TurnHeldEvent(
        turn_id=d.turn_id,
        session_id=d.session_id,
        from_version=record.version,
        by_version=version,
        reason=reason,
        problems=found,
        seq=d.next_seq,
    )
    return Planned([put], [event], turn=put.record)


def rewritten(d: Delivery, call: ToolCall) -> ToolCall:
    """The call to run for ``call``: a migration's replacement, if one is stored."""
    stored = d.steps.get(rewrite_step_id(d.turn_id, call.id))
    return ToolCall.from_dict(stored) if stored is not None else call
