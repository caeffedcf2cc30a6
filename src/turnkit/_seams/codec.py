"""The ``Codec`` seam: what a store does to each payload it keeps, and undoes on read.

A store given a codec passes every payload (a message, a step's result, an event,
a turn's opening, inbound event, suspend checkpoint, answer and error) through
``encode`` before it writes it and through ``decode`` when it reads it back; ids,
statuses, sequence numbers and times stay as they are, for the store's queries.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

#: Which field of a session a payload is: a codec binds a payload to it (and to the
#: session), so a stored payload cannot be moved to another session or field.
PayloadKind = Literal[
    "message", "step", "event", "opening", "inbound", "pending", "text", "error", "blob"
]


@runtime_checkable
class Codec(Protocol):
    """Turns a payload's bytes (UTF-8 JSON, or text) into the bytes a store keeps, and back.

    ``decode(session_id, kind, encode(session_id, kind, data)) == data`` must hold in
    every process that shares the store; ``decode`` raises ``StoreError`` (naming the
    session and why) for bytes it cannot turn back, such as a payload whose key is
    gone. Both are called on the store's path of every step, synchronously: keep them
    fast and never block on I/O there.
    """

    def encode(self, session_id: str, kind: PayloadKind, plaintext: bytes) -> bytes: ...

    def decode(self, session_id: str, kind: PayloadKind, stored: bytes) -> bytes: ...
