"""Whether a principal is a parked question's named answerer, and under which name.

A principal answers under its id, or under the alias the question names (the local
user answers a question an older ``turnkit run`` parked for ``cli:<login>`` as
``cli:<login>``), so the engine's answerer check stays a plain comparison.
"""

from __future__ import annotations

from .._channels.local_user import named_answerer
from .._seams.store import SessionStore, parked_turn
from .._values.inputs import InputRequest
from .principal import Principal


async def parked_request(store: SessionStore, turn_id: str, input_id: str) -> InputRequest | None:
    """The question ``input_id`` of turn ``turn_id``, if the session is parked on it."""
    record = await parked_turn(store)
    checkpoint = record.pending if record is not None else None
    if record is None or checkpoint is None or record.turn_id != turn_id:
        return None
    return checkpoint.find(input_id)


async def answering_as(
    store: SessionStore, principal: Principal, turn_id: str, input_id: str
) -> str:
    """The name ``principal`` answers the question under: the first of its names the
    question names as an answerer, else its id (``resume`` then says what is wrong)."""
    if not principal.aliases:
        return principal.id
    pending = await parked_request(store, turn_id, input_id)
    if pending is None:
        return principal.id
    return named_answerer(principal.names, pending.answerers) or principal.id
