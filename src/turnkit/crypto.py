"""Encryption at rest for the built-in stores (the ``turnkit[crypto]`` extra).

``EnvelopeCodec`` is a ``turnkit.Codec``: each payload is sealed with AES-GCM under
its session's data key, which is derived from a key of the session's tenant that a
``KeyProvider`` the app supplies names and holds; the envelope names that key.
``KeyRing`` is a provider that keeps keys in memory.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable
from typing import Protocol, TypeVar, get_args, runtime_checkable

from ._errors import ConfigurationError, StoreError
from ._seams.codec import PayloadKind, Seal

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "turnkit.crypto needs the cryptography package: pip install 'turnkit[crypto]'"
    ) from exc

#: The envelope's format version (its first byte).
VERSION = 1
_NONCE = 12
_DATA_KEY = 32
_KEY_SIZES = (16, 24, 32)
_K = TypeVar("_K")
_V = TypeVar("_V")


@runtime_checkable
class KeyProvider(Protocol):
    """The app's keys: which one a session's new writes use, and each key's bytes.

    ``current(session_id)`` names the key new writes of the session use (its tenant's
    newest); ``key(key_id)`` is that key's bytes (16, 24 or 32 of them), or ``None``
    once the key is gone, which makes everything sealed under it unreadable
    (crypto-shredding). A key id names one key for ever: a new key gets a new id.
    SQLite and PostgreSQL ask ``current`` once per commit that seals anything (the
    memory store once per payload), and every store asks ``key`` on every payload it
    reads, on the store's path: answer from memory, never from the network.
    """

    def current(self, session_id: str) -> str: ...

    def key(self, key_id: str) -> bytes | None: ...


class KeyRing:
    """Keys held in memory, per tenant. ``tenant_of(session_id)`` says whose a session
    is (everyone's the tenant ``"default"`` without it); ``add`` gives a tenant a new
    key, which its sessions' writes use from then on while the older ones still read;
    ``forget`` drops a key, and ``forget_tenant`` all of a tenant's keys."""

    def __init__(self, tenant_of: Callable[[str], str] | None = None) -> None:
        self._tenant_of = tenant_of if tenant_of is not None else _default_tenant
        self._keys: dict[str, bytes] = {}
        self._owner: dict[str, str] = {}
        self._current: dict[str, str] = {}

    def add(self, tenant: str, key_id: str, key: bytes) -> None:
        """Make ``key`` (16, 24 or 32 random bytes) ``tenant``'s current key."""
        if not key_id or len(key_id.encode()) > 255:
            raise ConfigurationError(f"a key id must be 1 to 255 bytes, got {key_id!r}")
        if len(key) not in _KEY_SIZES:
            raise ConfigurationError(f"key {key_id!r}: an AES key is 16, 24 or 32 bytes")
        if self._owner.get(key_id, tenant) != tenant:
            raise ConfigurationError(f"key id {key_id!r} is already another tenant's")
        if self._keys.get(key_id, key) != key:
            raise ConfigurationError(f"key id {key_id!r} already names another key")
        self._keys[key_id] = bytes(key)
        self._owner[key_id] = tenant
        self._current[tenant] = key_id

    def forget(self, key_id: str) -> None:
        """Drop one key: what it wrapped can no longer be read."""
        self._keys.pop(key_id, None)
        tenant = self._owner.pop(key_id, None)
        if tenant is not None and self._current.get(tenant) == key_id:
            del self._current[tenant]

    def forget_tenant(self, tenant: str) -> None:
        """Drop every key of ``tenant`` (crypto-shredding its sessions)."""
        for key_id in [k for k, t in self._owner.items() if t == tenant]:
            self.forget(key_id)

    def current(self, session_id: str) -> str:
        tenant = self._tenant_of(session_id)
        try:
            return self._current[tenant]
        except KeyError:
            raise StoreError(
                f"session {session_id}: tenant {tenant!r} has no key to encrypt with"
            ) from None

    def key(self, key_id: str) -> bytes | None:
        return self._keys.get(key_id)


class _Nonces:
    """Random 96-bit nonces, drawn from the OS's random source 512 at a time (one
    system call rather than one per payload). Each is handed out once, by one
    ``list.pop``, which is atomic whichever thread asks; a forked child drops what is
    left, so it never hands out one of its parent's."""

    _COUNT = 512

    def __init__(self) -> None:
        #: The nonces not handed out yet (``encode`` pops them itself: one call less).
        self.left: list[bytes] = []
        os.register_at_fork(after_in_child=self.left.clear)

    def take(self) -> bytes:
        try:
            return self.left.pop()
        except IndexError:
            return self.refill()

    def refill(self) -> bytes:
        """A fresh nonce, after adding a new batch to those left."""
        batch = os.urandom(_NONCE * self._COUNT)
        fresh = [batch[at : at + _NONCE] for at in range(0, len(batch), _NONCE)]
        nonce = fresh.pop()
        self.left.extend(fresh)
        return nonce


_nonces = _Nonces()
_left = _nonces.left


def _default_tenant(session_id: str) -> str:
    return "default"


def _associated(session_id: str, kind: str) -> bytes:
    """What a payload is bound to: its field and its session."""
    return f"{kind}\0{session_id}".encode()


class _DataKey:
    """A session's data key under one tenant key: its cipher, the envelope header
    naming the tenant key, each field's associated data, and its seals by prefix,
    each made once (a new function per commit would cost the interpreter more)."""

    __slots__ = ("aead", "associated", "header", "seals")

    def __init__(self, aead: AESGCM, header: bytes, session_id: str) -> None:
        self.aead = aead
        self.header = header
        self.associated = {kind: _associated(session_id, kind) for kind in get_args(PayloadKind)}
        self.seals: dict[bytes, Seal] = {}


def _sealing(entry: _DataKey, prefix: bytes, session_id: str) -> Seal:
    """``prefix`` and then each payload's envelope, made in one join: a fresh nonce
    from the pool, the payload sealed with its field and session as associated data."""
    encrypt, associated, head = entry.aead.encrypt, entry.associated, prefix + entry.header
    join, pop, refill = bytearray().join, _left.pop, _nonces.refill

    def seal(kind: PayloadKind, plaintext: bytes) -> bytearray:
        try:
            nonce = pop()
        except IndexError:
            nonce = refill()
        try:
            bound = associated[kind]
        except KeyError:
            bound = _associated(session_id, kind)
        return join((head, nonce, encrypt(nonce, plaintext, bound)))

    return seal


class EnvelopeCodec:
    """AES-GCM envelopes: a ``turnkit.Codec`` for any built-in store.

    Each session has its own 256-bit data key, derived (HKDF-SHA256) from its tenant's
    key with the key id and the session id, so every process holding the tenant's key
    makes the same one and nothing has to be stored for it. An envelope is
    ``[version][key id length][key id][nonce][sealed payload and tag]``: a fresh random
    96-bit nonce per payload, and the session id and the field (``kind``) as
    associated data, so a payload copied to another session or field does not decrypt.

    Rotation: a new current key (``keys.current``) seals every commit from the next
    one on (``sealer`` asks once per commit, ``encode`` once per payload); older
    envelopes read while their key exists, and ``reseal`` moves one under the current
    key. Crypto-shredding: once ``keys.key(key_id)`` answers ``None``, every envelope
    under that key fails to read, in every process, with a ``StoreError`` naming the
    session and the key (a provider must then no longer name it current either).
    ``cache_size`` bounds the data keys kept in memory.
    """

    def __init__(self, keys: KeyProvider, *, cache_size: int = 4096) -> None:
        if not isinstance(keys, KeyProvider):
            raise ConfigurationError(
                f"EnvelopeCodec needs a KeyProvider (current and key), got {type(keys).__name__}"
            )
        self._keys = keys
        self._cache_size = max(1, cache_size)
        #: (session, key id) -> the session's data key under that tenant key.
        self._data_keys: dict[tuple[str, str], _DataKey] = {}

    def encode(self, session_id: str, kind: PayloadKind, plaintext: bytes) -> bytes:
        entry = self._current(session_id)
        try:
            nonce = _left.pop()
        except IndexError:
            nonce = _nonces.refill()
        bound = entry.associated.get(kind) or _associated(session_id, kind)
        return b"".join((entry.header, nonce, entry.aead.encrypt(nonce, plaintext, bound)))

    def sealer(self, session_id: str, prefix: bytes) -> Seal:
        """What seals the session's payloads for one commit (see ``turnkit.Codec``):
        the provider names the current key once, here; each payload still gets a fresh
        nonce and its field and session as associated data."""
        entry = self._current(session_id)
        seal = entry.seals.get(prefix)
        if seal is None:
            seal = entry.seals[prefix] = _sealing(entry, prefix, session_id)
        return seal

    def _current(self, session_id: str) -> _DataKey:
        """The session's data key under the key its new writes use."""
        key_id = self._keys.current(session_id)
        entry = self._data_keys.get((session_id, key_id))
        return entry if entry is not None else self._data_key(session_id, key_id)

    def decode(self, session_id: str, kind: PayloadKind, stored: bytes) -> bytes:
        key_id, body = _parse(session_id, kind, stored)
        entry = self._data_key(session_id, key_id)
        try:
            bound = entry.associated.get(kind) or _associated(session_id, kind)
            return entry.aead.decrypt(body[:_NONCE], body[_NONCE:], bound)
        except InvalidTag:
            raise StoreError(
                f"session {session_id}: a stored {kind} does not decrypt under its key "
                f"{key_id!r}: it was altered, or copied from another session or field"
            ) from None

    def key_id(self, session_id: str, kind: PayloadKind, stored: bytes) -> str:
        """The id of the key the envelope ``stored`` is sealed under."""
        return _parse(session_id, kind, stored)[0]

    def reseal(self, session_id: str, kind: PayloadKind, stored: bytes) -> bytes | None:
        """``stored`` sealed again under the session's current key; ``None`` if it is
        under that key already (rotation: what a background pass would write back)."""
        if self.key_id(session_id, kind, stored) == self._keys.current(session_id):
            return None
        return self.encode(session_id, kind, self.decode(session_id, kind, stored))

    def _data_key(self, session_id: str, key_id: str) -> _DataKey:
        # Reads ask the provider every time, so a key it dropped stops every read at
        # once, cached or not (writes use the key it names current).
        tenant_key = self._keys.key(key_id)
        if tenant_key is None:
            raise _shredded(session_id, key_id)
        entry = self._data_keys.get((session_id, key_id))
        if entry is None:
            aead = AESGCM(_derive(tenant_key, key_id, session_id))
            entry = _DataKey(aead, _header(key_id), session_id)
            _bounded_put(self._data_keys, (session_id, key_id), entry, self._cache_size)
        return entry


def _derive(tenant_key: bytes, key_id: str, session_id: str) -> bytes:
    """The session's data key under ``tenant_key`` (HKDF-SHA256, no salt: the tenant key
    is random; the key id and session id as the info)."""
    info = b"turnkit data key\x00" + key_id.encode() + b"\x00" + session_id.encode()
    return HKDF(algorithm=hashes.SHA256(), length=_DATA_KEY, salt=None, info=info).derive(
        tenant_key
    )


def _shredded(session_id: str, key_id: str) -> StoreError:
    return StoreError(
        f"session {session_id}: its data is sealed under key {key_id!r}, which the key "
        "provider no longer has (the key was forgotten: the data cannot be read)"
    )


def _header(key_id: str) -> bytes:
    kid = key_id.encode()
    if not kid or len(kid) > 255:
        raise ConfigurationError(f"a key id must be 1 to 255 bytes, got {key_id!r}")
    return struct.pack("BB", VERSION, len(kid)) + kid


def _parse(session_id: str, kind: str, stored: bytes) -> tuple[str, bytes]:
    """An envelope's key id, and its nonce with the sealed payload."""
    if len(stored) < 2 or stored[0] != VERSION:
        raise StoreError(
            f"session {session_id}: a stored {kind} is not an envelope this turnkit reads "
            f"(version {stored[0] if stored else 'missing'})"
        )
    end = 2 + stored[1]
    if len(stored) < end + _NONCE + 16:
        raise StoreError(f"session {session_id}: a stored {kind} is cut short")
    return stored[2:end].decode("utf-8", "replace"), stored[end:]


def _bounded_put(cache: dict[_K, _V], key: _K, value: _V, limit: int) -> None:
    """Put ``value`` in ``cache``, dropping its oldest entry past ``limit`` (tool threads
    may do this at once: losing a race costs only an entry made again later)."""
    if len(cache) >= limit:
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):
            del cache[next(iter(cache))]
    cache[key] = value


__all__ = ["EnvelopeCodec", "KeyProvider", "KeyRing"]
