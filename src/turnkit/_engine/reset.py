"""Carrying out a pending reset: the barrier a reset records in the store.

``session.reset()`` records the request in the store (a ``RequestReset`` write)
and cancels the turns stored before it in the same write. Whichever process then
holds the session's writer lock carries it out: the resetting process's own reset
job, or a delivery of a turn stored after the request, which archives first and
then runs in the new generation. So a reset never depends on the process that
asked for it staying alive, and no turn stored after it runs in the old generation.
"""

from __future__ import annotations

from .._seams.store import NO_MESSAGES, SessionStore
from .._values.records import TurnRecord
from .._values.turn_rules import move
from .._values.writes import ArchiveGeneration, DropReset


async def carry_out_reset(store: SessionStore, agent: str) -> int | None:
    """Archive the live generation if a reset is pending; call it holding the writer.

    Returns the archived generation, or ``None`` when there was nothing to do: no
    reset pending (another process carried it out), or a generation that held
    nothing (status ``new``), whose mark is simply dropped. The turns the reset
    cancelled end with it: queued ones are settled ``cancelled``, and running or
    parked ones no delivery holds any more (this process has the lock) are ended
    ``cancelled`` before they go to the archive with the rest.
    """
    snap = await store.load(from_index=NO_MESSAGES)
    if not snap.reset_requested:
        return None
    generation = snap.generation
    if await store.status() == "new":
        await store.commit([DropReset()])
        return None
    cancelled = [r for r in await store.unfinished() if r.cancel_reason is not None]

    writes = [move(record, "cancelled") for record in cancelled]
    await store.commit([*writes, ArchiveGeneration(generation, snap.agent or agent)])
    return generation


def runs_after_reset(turn: TurnRecord | None) -> bool:
    """Whether a delivery of ``turn`` (``None``: not stored yet) belongs to the new
    generation of a pending reset: anything but a turn the reset cancelled."""
    return turn is None or turn.cancel_reason is None
