"""What the PostgreSQL event relay puts in a notification, and how it is read back.

NOTIFY takes a payload of less than 8000 bytes, so one batch of relayed entries
is cut into numbered chunks: ``schema/sender/number/index/count/mac/`` then a
piece of the batch's ASCII-only JSON (so a cut never splits a character).

Any role that may connect to the database can LISTEN and NOTIFY on any channel,
so a chunk is taken only with a valid ``mac``: an HMAC-SHA256 of everything else
in it, keyed with the schema's relay key, which only turnkit's roles can read
(``turnkit_relay_key``). The ``Reassembler`` checks it before it holds anything,
joins a batch's chunks whatever order they come in, bounds what it holds (chunks
per batch, unfinished batches, their bytes, their age), and never returns a
sender's batch twice or one older than a batch it already returned. What it
drops it counts, by reason, for the metrics.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..._seams.relay import Logged, Relayed
from ..._values.events import (
    DeliveryFailedEvent,
    MessageDeltaEvent,
    ReasoningDeltaEvent,
    TurnEvent,
    event_from_dict,
)

#: The largest payload sent, in bytes: PostgreSQL refuses 8000 and more.
MAX_PAYLOAD = 7900
#: Unfinished batches kept while their other chunks are awaited; the oldest go first.
PARTIAL_LIMIT = 16
#: Most chunks one batch may have (a publisher splits a larger batch before sending).
MAX_CHUNKS = 256
#: Most bytes of unfinished batches held at once; past it the oldest go.
MAX_HELD_BYTES = 4 * 1024 * 1024
#: Seconds an unfinished batch is kept: a batch's chunks are sent in one transaction
#: and arrive together, so one still missing chunks after this never completes.
PARTIAL_TTL = 5.0
#: Hex digits of the HMAC a chunk carries (128 bits).
MAC_DIGITS = 32
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
    return [
        "d",
        event.session_id,
        event.turn_id,
        event.type,
        event.next_seq,
        event.text,
        event.at,
        event.attempt,
    ]


def logged_entry(event: TurnEvent) -> list[Any]:
    return ["l", event.session_id, event.turn_id, event.seq]


def delta_from(entry: list[Any]) -> TurnEvent:
    """The delta event an ``"d"`` entry carries (``ValueError`` if it is malformed)."""
    # An older sender's entries have no attempt (seven items, not eight).
    _, session_id, turn_id, kind, next_seq, text, at, *rest = entry
    attempt = rest[0] if rest else None
    cls = _DELTA_KINDS.get(kind)
    if (
        cls is None
        or not isinstance(text, str)
        or not isinstance(session_id, str)
        or not (attempt is None or isinstance(attempt, str))
    ):
        raise ValueError(f"not a relayed delta: {entry!r}")
    return cls(
        session_id=session_id,
        turn_id=str(turn_id),
        text=text,
        next_seq=next_seq,
        at=at,
        attempt=attempt,
    )


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


def mac(key: bytes, signed: str) -> str:
    """The MAC a chunk carries over ``signed``, its every other part."""
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()[:MAC_DIGITS]


def encode(
    key: bytes, schema: str, sender: str, number: int, at: float, entries: list[list[Any]]
) -> list[str]:
    """The payloads that carry one batch, each under ``MAX_PAYLOAD`` bytes and
    signed with ``key``."""
    body = json.dumps({"at": at, "e": entries}, ensure_ascii=True, separators=(",", ":"))
    head = f"{schema}/{sender}/{number}/"
    # The index and count take at most as many digits as the count itself.
    room = MAX_PAYLOAD - len(head) - 2 * len(str(len(body))) - 3 - MAC_DIGITS
    pieces = [body[i : i + room] for i in range(0, len(body), room)] or [""]
    count = len(pieces)
    payloads = []
    for i, piece in enumerate(pieces):
        signed = f"{head}{i}/{count}/{piece}"
        payloads.append(f"{head}{i}/{count}/{mac(key, signed)}/{piece}")
    return payloads


class Reassembler:
    """Joins the chunks of ``schema``'s batches signed with ``key``; ignores other
    schemas and ``own`` sender. ``rejected`` counts what it dropped, by reason:
    ``forged`` (a wrong MAC), ``malformed`` (not a chunk, or a batch over the
    limits), ``stale`` (unfinished past ``PARTIAL_TTL``, or pushed out by newer
    ones)."""

    def __init__(
        self,
        schema: str,
        own: str,
        key: bytes,
        *,
        rejected: Counter[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._schema = schema
        self._own = own
        self._key = key
        self._clock = clock
        #: Per unfinished batch: when its first chunk came, and its chunks so far.
        self._partial: OrderedDict[tuple[str, int], tuple[float, list[str | None]]] = OrderedDict()
        self._held = 0
        self._last: OrderedDict[str, int] = OrderedDict()
        self.rejected: Counter[str] = rejected if rejected is not None else Counter()

    @property
    def holding(self) -> tuple[int, int]:
        """Unfinished batches held, and their bytes."""
        return len(self._partial), self._held

    def add(self, payload: str) -> Batch | None:
        """The batch ``payload`` completes, if it completes one that is new."""
        try:
            schema, sender, number_s, index_s, count_s, tag, piece = payload.split("/", 6)
        except ValueError:
            self.rejected["malformed"] += 1
            return None
        if schema != self._schema or sender == self._own:
            return None  # another schema's, or an echo of our own
        signed = f"{schema}/{sender}/{number_s}/{index_s}/{count_s}/{piece}"
        if not hmac.compare_digest(tag, mac(self._key, signed)):
            self.rejected["forged"] += 1
            return None
        try:
            number, index, count = int(number_s), int(index_s), int(count_s)
        except ValueError:
            self.rejected["malformed"] += 1
            return None
        if not 0 <= index < count <= MAX_CHUNKS:
            self.rejected["malformed"] += 1
            return None
        self._expire()
        if number <= self._last.get(sender, -1):
            return None  # a batch already delivered, or one older than it
        return self._hold(sender, number, index, count, piece)

    def _hold(self, sender: str, number: int, index: int, count: int, piece: str) -> Batch | None:
        key = (sender, number)
        found = self._partial.get(key)
        if found is None:
            found = self._partial[key] = (self._clock(), [None] * count)
        parts = found[1]
        if len(parts) != count or parts[index] is not None:
            self.rejected["malformed"] += 1
            return None
        parts[index] = piece
        self._held += len(piece)
        if any(p is None for p in parts):
            self._bound()
            return None
        self._forget(key)
        self._last[sender] = number
        self._last.move_to_end(sender)
        while len(self._last) > _SENDER_LIMIT:
            self._last.popitem(last=False)
        try:
            body = json.loads("".join(p for p in parts if p is not None))
            return Batch(sender, number, float(body["at"]), list(body["e"]))
        except (ValueError, TypeError, KeyError):
            self.rejected["malformed"] += 1
            return None

    def _bound(self) -> None:
        """Drop the oldest unfinished batches while more are held than allowed."""
        while self._partial and (len(self._partial) > PARTIAL_LIMIT or self._held > MAX_HELD_BYTES):
            self._forget(next(iter(self._partial)))
            self.rejected["stale"] += 1

    def _expire(self) -> None:
        cutoff = self._clock() - PARTIAL_TTL
        while self._partial:
            oldest = next(iter(self._partial))
            if self._partial[oldest][0] > cutoff:
                break
            self._forget(oldest)
            self.rejected["stale"] += 1

    def _forget(self, key: tuple[str, int]) -> None:
        _, parts = self._partial.pop(key)
        self._held -= sum(len(p) for p in parts if p is not None)
