"""What the PostgreSQL event relay puts in a notification, and how it is read back.

NOTIFY takes a payload of less than 8000 bytes, so one batch of relayed entries
is cut into numbered chunks: ``schema/sender/number/index/count/`` then a piece
of the batch's ASCII-only JSON (so a cut never splits a character). The
``Reassembler`` joins a batch's chunks whatever order they come in, keeps a
bounded number of unfinished batches, and never returns a sender's batch twice
or one older than a batch it already returned.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .._seams.relay import Logged, Relayed
from .._values.events import (
    DeliveryFailedEvent,
    MessageDeltaEvent,
    ReasoningDeltaEvent,
    TurnEvent,
    event_from_dict,
)

#: The largest payload sent, in bytes: PostgreSQL refuses 8000 and more.
MAX_PAYLOAD = 7900
#: Unfinished batches kept while their other chunks are awaited; the oldest go first.
_PARTIAL_LIMIT = 64
#: Senders whose last batch number is remembered (to drop a repeat); oldest go first.
_SENDER_LIMIT = 1024

_DELTA_KINDS: dict[str, type[MessageDeltaEvent | ReasoningDeltaEvent]] = {
    "message.delta": MessageDeltaEvent,
    "reasoning.delta": ReasoningDeltaEvent,
}


@dataclass(frozen=True)
class Batch:
    """One sender's relayed entries, as sent: ``at`` is when it was sent (epoch seconds)."""

    sender: str
    number: int
    at: float
    entries: list[list[Any]]


def delta_entry(event: MessageDeltaEvent | ReasoningDeltaEvent) -> list[Any]:
    return ["d", event.session_id, event.turn_id, event.type, event.next_seq, event.text, event.at]


def logged_entry(event: TurnEvent) -> list[Any]:
    return ["l", event.session_id, event.turn_id, event.seq]


def delta_from(entry: list[Any]) -> TurnEvent:
    """The delta event an ``"d"`` entry carries (``ValueError`` if it is malformed)."""
    _, session_id, turn_id, kind, next_seq, text, at = entry
    cls = _DELTA_KINDS.get(kind)
    if cls is None or not isinstance(text, str) or not isinstance(session_id, str):
        raise ValueError(f"not a relayed delta: {entry!r}")
    return cls(session_id=session_id, turn_id=str(turn_id), text=text, next_seq=next_seq, at=at)


def failure_entry(event: DeliveryFailedEvent) -> list[Any]:
    """A channel's failed reply: live only, and wanted wherever the turn is watched
    (the Slack route and the chat page may be served by different processes)."""
    return ["f", event.session_id, event.turn_id, event.to_dict()]


def relayed_from(entry: list[Any]) -> Relayed:
    """What an entry carries: a delta (``"d"``), a failed reply (``"f"``) or a hint
    that events were logged (``"l"``); ``ValueError`` if it is malformed."""
    kind = entry[0]
    if kind == "d":
        return delta_from(entry)
    if kind == "f":
        event = event_from_dict(entry[3])
        if not isinstance(event, DeliveryFailedEvent) or event.session_id != entry[1]:
            raise ValueError(f"not a relayed delivery failure: {entry!r}")
        return event
    if kind == "l":
        return Logged(session_id=entry[1], turn_id=str(entry[2]), seq=int(entry[3]))
    raise ValueError(f"not a relayed entry: {entry!r}")


def encode(schema: str, sender: str, number: int, at: float, entries: list[list[Any]]) -> list[str]:
    """The payloads that carry one batch, each under ``MAX_PAYLOAD`` bytes."""
    body = json.dumps({"at": at, "e": entries}, ensure_ascii=True, separators=(",", ":"))
    head = f"{schema}/{sender}/{number}/"
    # The index and count take at most as many digits as the count itself.
    room = MAX_PAYLOAD - len(head) - 2 * len(str(len(body))) - 2
    pieces = [body[i : i + room] for i in range(0, len(body), room)] or [""]
    count = len(pieces)
    return [f"{head}{i}/{count}/{piece}" for i, piece in enumerate(pieces)]


class Reassembler:
    """Joins the chunks of ``schema``'s batches; ignores other schemas and ``own`` sender."""

    def __init__(self, schema: str, own: str) -> None:
        self._schema = schema
        self._own = own
        self._partial: OrderedDict[tuple[str, int], list[str | None]] = OrderedDict()
        self._last: OrderedDict[str, int] = OrderedDict()

    def add(self, payload: str) -> Batch | None:
        """The batch ``payload`` completes, if it completes one that is new."""
        try:
            schema, sender, number_s, index_s, count_s, piece = payload.split("/", 5)
            number, index, count = int(number_s), int(index_s), int(count_s)
        except ValueError:
            return None  # not one of ours
        if schema != self._schema or sender == self._own or not 0 <= index < count:
            return None
        if number <= self._last.get(sender, -1):
            return None  # a batch already delivered, or one older than it
        key = (sender, number)
        parts = self._partial.get(key)
        if parts is None:
            parts = self._partial[key] = [None] * count
            while len(self._partial) > _PARTIAL_LIMIT:
                self._partial.popitem(last=False)
        if len(parts) != count:
            return None
        parts[index] = piece
        if any(p is None for p in parts):
            return None
        del self._partial[key]
        self._last[sender] = number
        self._last.move_to_end(sender)
        while len(self._last) > _SENDER_LIMIT:
            self._last.popitem(last=False)
        try:
            body = json.loads("".join(p for p in parts if p is not None))
            return Batch(sender, number, float(body["at"]), list(body["e"]))
        except (ValueError, TypeError, KeyError):
            return None
