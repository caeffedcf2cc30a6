"""``FileBlobStore``: a ``BlobStore`` in a directory, for ``SqliteStore`` (and any store
given one); ``MemoryBlobStore``, one in a dict, for tests and the ``MemoryStore``.

``<directory>/<session>/<turn>/<name>``, where session and turn are hex BLAKE2b
digests of their ids (any id makes a safe, fixed-length file name) and ``name`` is
the blob's SHA-256. A blob is written to a temporary file, flushed to disk
(``fsync``) and renamed into place, so a reader never sees half of one and a row
that commits after ``put`` never refers to a blob a power cut could lose.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

from .._errors import ConfigurationError, StoreError

_NAME = frozenset("0123456789abcdef")


def blob_key(text: str) -> str:
    """A session's or turn's id as a safe, fixed-length path component."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def check_name(session_id: str, name: str) -> None:
    """Refuse what is not a blob name (64 lowercase hex digits) before it names a path."""
    if len(name) != 64 or not _NAME.issuperset(name):
        raise StoreError(f"session {session_id}: {name!r} is not a blob name")


class FileBlobStore:
    """Blobs as files under ``directory`` (made on first use).

    ``fsync=False`` skips flushing each blob to disk: faster, and safe against a
    crashed process but not against a power cut or a kernel crash.
    """

    def __init__(self, directory: str | os.PathLike[str], *, fsync: bool = True) -> None:
        if not str(directory):
            raise ConfigurationError("FileBlobStore needs a directory")
        self.directory = Path(directory)
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"FileBlobStore({str(self.directory)!r})"

    def _session_dir(self, session_id: str) -> Path:
        key = blob_key(session_id)
        return self.directory / key[:2] / key

    def _path(self, session_id: str, turn_id: str, name: str) -> Path:
        check_name(session_id, name)
        return self._session_dir(session_id) / blob_key(turn_id) / name

    def put(self, session_id: str, turn_id: str, name: str, data: bytes) -> None:
        path = self._path(session_id, turn_id, name)
        if path.exists():
            return  # the same name is the same bytes (a read checks it)
        try:
            new_dirs = not path.parent.is_dir()
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{name}.{uuid.uuid4().hex}")
            with open(temporary, "wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(temporary, path)
            if self.fsync:
                # The file's entry, and the entries of the directories made for it.
                for parent in list(path.parents)[: 4 if new_dirs else 1]:
                    _fsync_dir(parent)
        except OSError as exc:
            raise StoreError(f"session {session_id}: cannot write blob {name}: {exc}") from exc

    def get(self, session_id: str, turn_id: str, name: str) -> bytes | None:
        try:
            return self._path(session_id, turn_id, name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"session {session_id}: cannot read blob {name}: {exc}") from exc

    def delete_turns(self, session_id: str, turn_ids: Iterable[str]) -> None:
        session = self._session_dir(session_id)
        for turn_id in turn_ids:
            _remove(session / blob_key(turn_id))

    def delete_session(self, session_id: str) -> None:
        _remove(self._session_dir(session_id))


def _remove(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot delete blobs in {path}: {exc}") from exc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MemoryBlobStore:
    """Blobs in a dict, gone with the object (thread-safe)."""

    def __init__(self) -> None:
        self._blobs: dict[str, dict[str, dict[str, bytes]]] = {}
        self._lock = threading.Lock()

    def put(self, session_id: str, turn_id: str, name: str, data: bytes) -> None:
        with self._lock:
            turns = self._blobs.setdefault(session_id, {})
            turns.setdefault(turn_id, {}).setdefault(name, bytes(data))

    def get(self, session_id: str, turn_id: str, name: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(session_id, {}).get(turn_id, {}).get(name)

    def delete_turns(self, session_id: str, turn_ids: Iterable[str]) -> None:
        with self._lock:
            turns = self._blobs.get(session_id, {})
            for turn_id in turn_ids:
                turns.pop(turn_id, None)

    def delete_session(self, session_id: str) -> None:
        with self._lock:
            self._blobs.pop(session_id, None)

    def count(self, session_id: str | None = None) -> int:
        """How many blobs it holds (of one session, or of all)."""
        with self._lock:
            sessions = [self._blobs.get(session_id, {})] if session_id else self._blobs.values()
            return sum(len(names) for turns in sessions for names in turns.values())
