"""How the built-in stores keep a payload: JSON text, sealed by the store's ``Codec``.

Without a codec a payload is its JSON text, as ever. With one, the codec's bytes are
kept in one of two forms, both recognised on read beside rows stored in the clear
(no value turnkit stores holds NUL, so neither can be mistaken for one):

- binary (SQLite, memory): a BLOB, NUL and then the codec's bytes, built as the
  type the store binds fastest (SQLite's driver binds a ``bytearray`` as it is, but
  looks a ``bytes`` value up among its adapters first: about 1.5 µs a row);
- text (PostgreSQL, whose columns are ``text``): the JSON text of a string that
  starts with NUL and carries the codec's bytes in base64 (``"\\u0000…"``), still
  valid JSON, so the one-statement load can aggregate it.
"""

from __future__ import annotations

import binascii
import functools
import json
import re
import secrets
from base64 import b64decode, b64encode
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from .._errors import ConfigurationError, StoreError
from .._seams.codec import Codec, PayloadKind, Seal, SealsPerCommit
from .._values.checkpoints import SuspendCheckpoint
from .._values.frozen import replaced
from .._values.inbound import InboundEvent
from .._values.messages import OpeningMessage, UserMessage, opening_from_dict
from .._values.records import TurnRecord
from . import _spill as spill
from ._json import json_bytes
from ._spill import GetBlob, PutBlob

#: A payload as its column keeps it: JSON text, or the binary form (see above).
Column: TypeAlias = str | bytes | bytearray
#: How a payload becomes a column's value: ``(session_id, kind, value, turn_id)``.
Dump: TypeAlias = Callable[[str, PayloadKind, Any, str], Column]

#: How a sealed payload's text form begins: a JSON string whose first character is NUL.
SEALED_PREFIX = '"\\u0000'
_SEALED = re.compile(r'"\\u0000[A-Za-z0-9+/]*={0,2}"')


def dumps(value: Any) -> str:
    """A value as the JSON text a store keeps; ``StoreError`` if it is not JSON."""
    try:
        return json_bytes(value).decode()
    except Exception as exc:
        raise StoreError(f"cannot store a value as JSON: {exc}") from exc


def _plain_dump(session_id: str, kind: PayloadKind, value: Any, turn_id: str = "") -> str:
    """``Payloads.dump`` without a codec: the value's JSON text."""
    try:
        return json_bytes(value).decode()
    except Exception as exc:
        raise StoreError(f"cannot store a value as JSON: {exc}") from exc


def _no_codec(session_id: str, kind: PayloadKind, plaintext: bytes) -> bytes:
    """What seals a payload in a store given no codec: nothing may be sealed there."""
    raise StoreError("a payload can be sealed only by a store given a codec")


class _CommitSeals:
    """One commit's payloads under a codec: the codec makes its ``Seal`` for a session
    at the session's first payload (none if nothing is sealed: a commit that only
    deletes asks for no key) and seals the rest of the commit's with it; the binary
    form comes out of the seal whole (NUL and the envelope, one copy)."""

    __slots__ = ("_binary", "_prefix", "_sealer", "_seals")

    def __init__(self, sealer: Callable[[str, bytes], Seal], binary: bool) -> None:
        self._sealer = sealer
        self._binary = binary
        self._prefix = b"\x00" if binary else b""
        self._seals: dict[str, Seal] = {}

    def dump(self, session_id: str, kind: PayloadKind, value: Any, turn_id: str = "") -> Column:
        try:
            encoded = json_bytes(value)
        except Exception as exc:
            raise StoreError(f"cannot store a value as JSON: {exc}") from exc
        seal = self._seals.get(session_id)
        if seal is None:
            seal = self._seals[session_id] = self._sealer(session_id, self._prefix)
        if self._binary:
            return seal(kind, encoded)
        return f'{SEALED_PREFIX}{b64encode(seal(kind, encoded)).decode("ascii")}"'


def _sealer_of(codec: Codec | None) -> Callable[[str, bytes], Seal]:
    """The codec's ``sealer``, or one made of its ``encode`` if it has none."""
    if isinstance(codec, SealsPerCommit):
        return codec.sealer
    seal_bytes = _no_codec if codec is None else codec.encode

    def sealer(session_id: str, prefix: bytes) -> Seal:
        join = bytearray().join

        def seal(kind: PayloadKind, plaintext: bytes) -> bytearray:
            return join((prefix, seal_bytes(session_id, kind, plaintext)))

        return seal

    return sealer


def _is_sealed_text(stored: object) -> bool:
    return (
        isinstance(stored, str)
        and stored.startswith(SEALED_PREFIX)
        and _SEALED.fullmatch(stored) is not None
    )


class Payloads:
    """A store's payload encoding: plain JSON (``codec=None``) or sealed by ``codec``,
    in the binary form (``binary=True``, each value a ``blob_type``) or the text form.

    ``dump`` makes a column's value, ``load`` reads one back, ``value`` finishes a
    value already parsed from JSON (a sealed text form parses to a NUL-led string);
    ``*_text`` do the same for the columns that hold text rather than JSON (a turn's
    answer and error). A sealed payload met without a codec is refused with a
    ``StoreError``, never shown as its ciphertext.

    With a ``threshold`` and ``get_blob``, a message, step or event whose JSON is over
    ``threshold`` bytes leaves its large parts as blobs (``_spill``): ``dumper(put)``
    makes the dump that does it, and every read resolves a reference through
    ``get_blob``, opening and checking each blob.
    """

    __slots__ = (
        "_framed",
        "_seal_bytes",
        "_sealer",
        "binary",
        "codec",
        "dump",
        "get_blob",
        "threshold",
    )

    #: ``value`` as its column keeps it (sealed when there is a codec); a plain
    #: function without one, so the default path costs what it did before codecs.
    dump: Callable[..., Column]

    def __init__(
        self,
        codec: Codec | None = None,
        *,
        binary: bool = False,
        blob_type: type[bytes] | type[bytearray] = bytes,
        threshold: int | None = None,
        get_blob: GetBlob | None = None,
    ) -> None:
        self.dump = _plain_dump if codec is None else self._sealed_dump
        if codec is not None and not isinstance(codec, Codec):
            raise ConfigurationError(
                f"a store's codec needs encode and decode methods, got {type(codec).__name__}"
            )
        #: The codec's ``encode``, called straight from the sealing paths.
        self._seal_bytes = _no_codec if codec is None else codec.encode
        #: What makes a commit's ``Seal`` for a session (see ``turnkit.Codec``).
        self._sealer: Callable[[str, bytes], Seal] = _sealer_of(codec)
        #: NUL and a sealed payload, joined as one ``blob_type`` (the binary form).
        self._framed: Callable[[tuple[bytes, bytes]], bytes | bytearray] = blob_type().join
        if threshold is not None and (isinstance(threshold, bool) or threshold < 1):
            raise ConfigurationError(
                f"a store's blob_threshold must be a positive number of bytes, got {threshold!r}"
            )
        self.codec = codec
        self.binary = binary
        #: Payloads whose JSON is longer than this many bytes go to blobs (``None``: none).
        self.threshold = threshold if get_blob is not None else None
        self.get_blob = get_blob

    def dumper(self, put: PutBlob | None) -> Dump:
        """The dump of one transaction whose blobs go to ``put``: ``dump`` itself when
        nothing is sealed or spilled, so a store without either runs the code it ran
        before; under a codec, one that asks for each session's ``Seal`` once."""
        if self.threshold is None or put is None:
            return self.dump if self.codec is None else self._commit_dump()
        return functools.partial(self._spilling_dump, put, spill.Seen())

    def _commit_dump(self) -> Dump:
        """``dump`` for one commit under a codec (see ``_CommitSeals``)."""
        return _CommitSeals(self._sealer, self.binary).dump

    def _spilling_dump(
        self,
        put: PutBlob,
        seen: spill.Seen,
        session_id: str,
        kind: PayloadKind,
        value: Any,
        turn_id: str,
    ) -> Column:
        try:
            encoded = json_bytes(value)
        except Exception as exc:
            raise StoreError(f"cannot store a value as JSON: {exc}") from exc
        threshold = self.threshold
        if threshold is not None and len(encoded) > threshold:
            encoded = self.spill(put, seen, session_id, turn_id, value, encoded)
        if self.codec is None:
            return encoded.decode()
        sealed = self._seal_bytes(session_id, kind, encoded)
        return self._framed((b"\x00", sealed)) if self.binary else self._as_text(sealed)

    def spill(
        self,
        put: PutBlob,
        seen: spill.Seen,
        session_id: str,
        turn_id: str,
        value: Any,
        encoded: bytes,
    ) -> bytes:
        """The JSON a row keeps for ``value`` (``encoded``, over the threshold): its
        large parts put as blobs, a reference to them. ``seen`` is the transaction's:
        a part it has put already is not put again.

        A blob's name is its SHA-256, except under a codec: then the name is random
        (a digest of the plaintext would let whoever lists the blobs confirm a guess
        of it), and the digest travels in the sealed reference."""
        assert self.threshold is not None
        rest, parts = spill.split(value, encoded, self.threshold, seen)
        blobs: list[tuple[str | None, str, int, str]] = []
        for field, plaintext in parts:
            known = seen.blobs.get(plaintext)
            if known is None:
                digest = spill.blob_name(plaintext)
                if self.codec is None:
                    name, stored = digest, plaintext
                else:
                    name = secrets.token_hex(32)
                    stored = self.seal(session_id, "blob", plaintext)
                put(session_id, turn_id, name, stored)
                known = seen.blobs[plaintext] = (name, digest)
            blobs.append((field, known[0], len(plaintext), known[1]))
        return json_bytes(spill.reference(turn_id, blobs, rest, value))

    def first_text(self, session_id: str, stored: Column) -> str | None:
        """The ``text`` of a stored message, for the session list's preview: opened if
        sealed, but a spilled text is not fetched (its reference keeps its start)."""
        if not isinstance(stored, str) and stored[:1] == b"\x00":
            parsed = json.loads(self._decode(session_id, "message", bytes(stored[1:])))
        else:
            parsed = json.loads(stored)
        while isinstance(parsed, str) and parsed[:1] == "\x00":
            if parsed[1:2] == "~":
                return spill.head(parsed)
            parsed = json.loads(self._open_text(session_id, "message", parsed))
        text = parsed.get("text") if isinstance(parsed, dict) else None
        return text if isinstance(text, str) else None

    def _blob(self, session_id: str, turn_id: str, name: str, digest: str, kind: str) -> bytes:
        """A blob's JSON: fetched, opened if sealed, and checked against its digest."""
        get = self.get_blob
        if get is None:
            raise spill.missing(session_id, kind, turn_id, name, opened_without=True)
        stored = get(session_id, turn_id, name)
        if stored is None:
            raise spill.missing(session_id, kind, turn_id, name)
        if stored[:1] == b"\x00":
            try:
                plaintext = self._decode(session_id, "blob", stored[1:])
            except StoreError as exc:
                raise spill.damaged(session_id, kind, turn_id, name, str(exc)) from exc
        else:
            plaintext = stored
        if spill.blob_name(plaintext) != digest:
            why = "its bytes do not match their SHA-256"
            raise spill.damaged(session_id, kind, turn_id, name, why)
        return plaintext

    def _resolve(self, session_id: str, kind: PayloadKind, ref: str) -> Any:
        def fetch(turn_id: str, name: str, digest: str, what: str) -> bytes:
            return self._blob(session_id, turn_id, name, digest, what)

        return spill.resolve(session_id, kind, ref, fetch)

    def _as_text(self, sealed: bytes | bytearray) -> str:
        return f'{SEALED_PREFIX}{b64encode(sealed).decode("ascii")}"'

    def _decode(self, session_id: str, kind: PayloadKind, sealed: bytes) -> bytes:
        if self.codec is None:
            raise StoreError(
                f"session {session_id}: its stored {kind} is encrypted, and this store "
                "was opened without a codec (give it the codec it was written with)"
            )
        return self.codec.decode(session_id, kind, sealed)

    def _open_text(self, session_id: str, kind: PayloadKind, parsed: str) -> bytes:
        """The plaintext of ``parsed``, the NUL-led string a text form parses to."""
        try:
            data = b64decode(parsed[1:], validate=True)
        except binascii.Error as exc:
            raise StoreError(f"session {session_id}: a stored {kind} is damaged: {exc}") from exc
        return self._decode(session_id, kind, data)

    def _sealed_dump(
        self, session_id: str, kind: PayloadKind, value: Any, turn_id: str = ""
    ) -> Column:
        try:
            encoded = json_bytes(value)
        except Exception as exc:
            raise StoreError(f"cannot store a value as JSON: {exc}") from exc
        sealed = self._seal_bytes(session_id, kind, encoded)
        return self._framed((b"\x00", sealed)) if self.binary else self._as_text(sealed)

    def seal(self, session_id: str, kind: PayloadKind, encoded: bytes) -> bytes:
        """A value already encoded as JSON (``encoded``), as a binary store keeps it."""
        if self.codec is None:
            return encoded
        return b"\x00" + self._seal_bytes(session_id, kind, encoded)

    def value(self, session_id: str, kind: PayloadKind, parsed: Any) -> Any:
        """A payload parsed from its column's JSON, opened if it was sealed."""
        if isinstance(parsed, str) and parsed[:1] == "\x00":
            if parsed[1:2] == "~":
                return self._resolve(session_id, kind, parsed)
            return self.value(
                session_id, kind, json.loads(self._open_text(session_id, kind, parsed))
            )
        return parsed

    def load(self, session_id: str, kind: PayloadKind, stored: Column) -> Any:
        """A payload from its column's value."""
        if not isinstance(stored, str) and stored[:1] == b"\x00":
            return self.value(
                session_id, kind, json.loads(self._decode(session_id, kind, bytes(stored[1:])))
            )
        return self.value(session_id, kind, json.loads(stored))

    def dump_text(self, session_id: str, kind: PayloadKind, text: str | None) -> Column | None:
        if text is None or self.codec is None:
            return text
        sealed = self._seal_bytes(session_id, kind, text.encode())
        return self._framed((b"\x00", sealed)) if self.binary else self._as_text(sealed)

    def load_text(self, session_id: str, kind: PayloadKind, stored: Column | None) -> str | None:
        if isinstance(stored, bytes | bytearray):
            if stored[:1] != b"\x00":
                return stored.decode()
            return self._decode(session_id, kind, bytes(stored[1:])).decode()
        if not _is_sealed_text(stored):
            return stored
        assert stored is not None
        return self._open_text(session_id, kind, json.loads(stored)).decode()

    # -- a turn's payloads: encoded here, decoded here, nowhere else ------------------

    def opening(self, session_id: str, record: TurnRecord, dump: Dump | None = None) -> Column:
        """The stored form of ``record``'s opening message (``dump``: the
        transaction's, which may spill to blobs; else this encoding's own)."""
        return (dump or self.dump)(session_id, "opening", record.opening.to_dict(), record.turn_id)

    def event(self, session_id: str, record: TurnRecord, dump: Dump | None = None) -> Column | None:
        """The stored form of ``record``'s inbound event (``None``: it came with none)."""
        event = record.event
        if event is None:
            return None
        return (dump or self.dump)(session_id, "inbound", event.to_dict(), record.turn_id)

    def pending(
        self, session_id: str, record: TurnRecord, dump: Dump | None = None
    ) -> Column | None:
        """The stored form of ``record``'s suspend checkpoint (``None``: it has none)."""
        pending = record.pending
        if pending is None:
            return None
        return (dump or self.dump)(session_id, "pending", pending.to_dict(), record.turn_id)

    def turn_from_row(self, row: Sequence[Any]) -> TurnRecord:
        """A ``TurnRecord`` from a row selected with ``_sql_rows.TURN_COLUMNS``."""
        sid, tid, agent, status, opening, event, text, error, created, finished, pending, why = row[
            :12
        ]
        return TurnRecord(
            session_id=sid,
            turn_id=tid,
            agent=agent,
            status=status,
            opening=self._opening(sid, tid, opening),
            event=self._event(sid, event),
            text=self.load_text(sid, "text", text),
            error=self.load_text(sid, "error", error),
            created_at=created,
            finished_at=finished,
            pending=self._pending(sid, pending),
            cancel_reason=why,
            version=row[12],
            held_by=row[13],
            wake_at=row[14],
            tenant=row[15] if len(row) > 15 and row[15] is not None else "",
        )

    def keep_turn(self, record: TurnRecord) -> KeptTurn:
        """``record`` as a store that keeps records rather than rows holds it: its
        payloads in their stored form (sealed under a codec); ``turn`` reads it back."""
        sid = record.session_id
        return KeptTurn(
            record=replaced(
                record,
                opening=_NO_OPENING,
                event=None,
                pending=None,
                text=None,
                error=None,
            ),
            opening=self.opening(sid, record),
            event=self.event(sid, record),
            pending=self.pending(sid, record),
            text=self.dump_text(sid, "text", record.text),
            error=self.dump_text(sid, "error", record.error),
        )

    def turn(self, kept: KeptTurn) -> TurnRecord:
        """The record ``keep_turn`` kept, its payloads decoded."""
        record = kept.record
        sid, tid = record.session_id, record.turn_id
        return replaced(
            record,
            opening=self._opening(sid, tid, kept.opening),
            event=self._event(sid, kept.event),
            pending=self._pending(sid, kept.pending),
            text=self.load_text(sid, "text", kept.text),
            error=self.load_text(sid, "error", kept.error),
        )

    def _opening(self, session_id: str, turn_id: str, stored: Column) -> OpeningMessage:
        return opening_from_dict(self.load(session_id, "opening", stored), turn_id)

    def _event(self, session_id: str, stored: Column | None) -> InboundEvent | None:
        if not stored:
            return None
        return InboundEvent.from_dict(self.load(session_id, "inbound", stored))

    def _pending(self, session_id: str, stored: Column | None) -> SuspendCheckpoint | None:
        if not stored:
            return None
        return SuspendCheckpoint.from_dict(self.load(session_id, "pending", stored))


#: What a kept record's opening holds while the real one is kept encoded beside it.
_NO_OPENING = UserMessage(text="", turn_id="")


@dataclass(frozen=True, slots=True)
class KeptTurn:
    """A turn as the memory store holds it: the record's plain fields in ``record``
    (its payload fields emptied), and each payload in its stored form."""

    record: TurnRecord
    opening: Column
    event: Column | None
    pending: Column | None
    text: Column | None
    error: Column | None


#: The encoding of a store without a codec.
PLAIN = Payloads()
