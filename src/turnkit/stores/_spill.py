"""Large payloads (``BlobStore``): which parts of a payload leave its row, the
reference the row keeps instead, and how a blob is named and checked.

A payload whose JSON is over the store's threshold is split: each top-level field of
a JSON object whose own JSON is over half the threshold becomes a blob (a tool
result's ``result``, a reply's ``tool_calls``, a message's ``text``), or, when no
field is that large or the payload is not an object, the whole payload does. The
row keeps a *reference*: the JSON of a string that starts with NUL and ``~``
(``"\\u0000~{...}"``, which no stored value can be: turnkit's values hold no NUL),
carrying the turn, each blob's field, name, size and SHA-256, and the rest of the
payload.

A blob's name is the SHA-256 of its JSON (random under a codec: see
``Payloads.spill``), so the step, message and event that carry one tool result write
it once, and a read checks the bytes it got against the digest the reference keeps.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from .._errors import StoreError
from ._json import json_bytes

#: A store's default ``blob_threshold``: payloads whose JSON is longer go to its blobs.
DEFAULT_BLOB_THRESHOLD = 256 * 1024

#: How a reference's string begins (after the JSON quote, NUL is ``\\u0000``).
REF = "\x00~"

#: ``put(session_id, turn_id, name, stored_bytes)``: keeps a blob for the commit being built.
PutBlob = Callable[[str, str, str, bytes], None]
#: ``get(session_id, turn_id, name)``: a blob's stored bytes, or ``None``.
GetBlob = Callable[[str, str, str], "bytes | None"]


def blob_name(plaintext: bytes) -> str:
    """The name of a blob: the hex SHA-256 of its JSON."""
    return hashlib.sha256(plaintext).hexdigest()


class Seen:
    """What one transaction has spilled so far, so the copies of one payload in one
    commit (a tool result's step, message and event) cost one encoding, one digest
    and one ``put``: field encodings by the field object (kept, so its id stays its
    own), and each blob put, by its bytes, with its name and digest."""

    __slots__ = ("blobs", "fields")

    def __init__(self) -> None:
        self.fields: dict[int, tuple[Any, bytes]] = {}
        self.blobs: dict[bytes, tuple[str, str]] = {}

    def encoded(self, field: Any) -> bytes:
        known = self.fields.get(id(field))
        if known is not None and known[0] is field:
            return known[1]
        data = json_bytes(field)
        self.fields[id(field)] = (field, data)
        return data


def split(
    value: Any, encoded: bytes, threshold: int, seen: Seen
) -> tuple[Any, list[tuple[str | None, bytes]]]:
    """``value``'s large parts, each as (field, its JSON), and what stays in the row
    (the object with those fields ``None``, or ``None`` when the whole value goes)."""
    if isinstance(value, dict):
        limit = threshold // 2
        parts: list[tuple[str | None, bytes]] = []
        for key, field in value.items():
            if isinstance(field, str):
                if len(field) * 6 + 2 <= limit:  # cannot be over the limit as JSON
                    continue
            elif not isinstance(field, (list, dict)):
                continue
            data = seen.encoded(field)
            if len(data) > limit:
                parts.append((key, data))
        if parts:
            spilled = {key for key, _ in parts}
            rest = {k: (None if k in spilled else v) for k, v in value.items()}
            return rest, parts
    return None, [(None, encoded)]


#: How much of a spilled text field its reference keeps, first, for the session
#: list's preview: read from the start of the row, without fetching the blob.
HEAD_CHARS = 100
_HEAD = REF + '{"h":'


def reference(
    turn_id: str, blobs: list[tuple[str | None, str, int, str]], rest: Any, value: Any
) -> str:
    """The string a row keeps for ``value``, whose large parts are ``blobs`` (field,
    name, size, SHA-256) and whose other fields are ``rest``; a spilled ``text``
    field's first characters lead it."""
    spec: dict[str, Any] = {}
    text = value.get("text") if isinstance(value, dict) else None
    if isinstance(text, str) and rest is not None and rest.get("text") is None:
        spec["h"] = text[:HEAD_CHARS]
    spec.update(t=turn_id, b=blobs, v=rest)
    return REF + json_bytes(spec).decode()


def head(ref: str) -> str | None:
    """The first characters of a reference's spilled ``text`` (``None``: it has none)."""
    if not ref.startswith(_HEAD):
        return None
    try:
        found, _ = json.JSONDecoder().raw_decode(ref, len(_HEAD))
    except ValueError:
        return None
    return found if isinstance(found, str) else None


def head_of_stored(stored: str) -> str | None:
    """``head`` of a reference given as its column's JSON text, perhaps cut short
    (the session list reads only the start of a row)."""
    for cut in range(8):  # a cut may fall inside an escape: back off to a whole one
        try:
            ref = json.loads(stored[: len(stored) - cut] + '"')
        except ValueError:
            continue
        return head(ref) if isinstance(ref, str) else None
    return None


def resolve(
    session_id: str,
    kind: str,
    ref: str,
    fetch: Callable[[str, str, str, str], bytes],
) -> Any:
    """The payload a reference stands for; ``fetch(turn_id, name, digest, kind)``
    returns a blob's JSON, checked against its digest."""
    try:
        spec = json.loads(ref[len(REF) :])
        turn_id, blobs, rest = spec["t"], spec["b"], spec["v"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(
            f"session {session_id}: a stored {kind}'s blob reference is damaged"
        ) from exc
    for field, name, _size, digest in blobs:
        value = json.loads(fetch(turn_id, name, digest, kind))
        if field is None:
            return value
        rest[field] = value
    return rest


def missing(
    session_id: str, kind: str, turn_id: str, name: str, *, opened_without: bool = False
) -> StoreError:
    where = f"session {session_id}: a stored {kind} of turn {turn_id} refers to blob {name}"
    if opened_without:
        return StoreError(
            f"{where}, and this store was opened without blobs (give it the blob store "
            "it was written with)"
        )
    return StoreError(
        f"{where}, which the blob store does not have (deleted outside turnkit, or this "
        "store was opened with another blob store than the one it was written with)"
    )


def damaged(session_id: str, kind: str, turn_id: str, name: str, why: str) -> StoreError:
    return StoreError(
        f"session {session_id}: blob {name} (a stored {kind} of turn {turn_id}) is damaged: {why}"
    )
