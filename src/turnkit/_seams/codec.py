"""The ``Codec`` seam: what a store does to each payload it keeps, and undoes on read.

A store given a codec passes every payload (a message, a step's result, an event,
a turn's opening, inbound event, suspend checkpoint, answer and error) through
``encode`` before it writes it and through ``decode`` when it reads it back; ids,
statuses, sequence numbers and times stay as they are, for the store's queries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, TypeAlias, runtime_checkable

#: Which field of a session a payload is: a codec binds a payload to it (and to the
#: session), so a stored payload cannot be moved to another session or field.
PayloadKind = Literal[
    "message", "step", "event", "opening", "inbound", "pending", "text", "error", "blob"
]

#: What a codec's optional ``sealer(session_id, prefix)`` returns: ``seal(kind,
#: plaintext)``, ``prefix`` and then the stored bytes of one payload of that session
#: (see ``Codec``).
Seal: TypeAlias = Callable[[PayloadKind, bytes], bytearray]


@runtime_checkable
class Codec(Protocol):
    """Turns a payload's bytes (UTF-8 JSON, or text) into the bytes a store keeps, and back.

    ``decode(session_id, kind, encode(session_id, kind, data)) == data`` must hold in
    every process that shares the store; ``decode`` raises ``StoreError`` (naming the
    session and why) for bytes it cannot turn back, such as a payload whose key is
    gone. Both are called on the store's path of every step, synchronously: keep them
    fast and never block on I/O there.

    A codec may also offer ``sealer(session_id, prefix) -> Seal``: a function that
    seals one payload of that session as ``encode`` would and returns ``prefix`` and
    then those bytes as one ``bytearray`` (the store's framing, joined in the same
    copy), made once for the span of one commit. SQLite and PostgreSQL ask for it at a
    commit's first payload and seal the rest of the commit's payloads with it, so what
    ``encode`` looks up per payload (a key, say) is looked up once per commit; a codec
    without it is called through ``encode``, payload by payload. ``decode`` is called
    per payload either way.
    """

    def encode(self, session_id: str, kind: PayloadKind, plaintext: bytes) -> bytes: ...

    def decode(self, session_id: str, kind: PayloadKind, stored: bytes) -> bytes: ...


@runtime_checkable
class SealsPerCommit(Protocol):
    """A codec that offers ``sealer`` (see ``Codec``)."""

    def sealer(self, session_id: str, prefix: bytes) -> Seal: ...
