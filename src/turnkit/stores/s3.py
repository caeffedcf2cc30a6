"""``S3BlobStore``: a ``BlobStore`` in an S3-compatible bucket (extra ``turnkit[s3]``, on
boto3), so a store's large payloads live in an object store every host reaches.

Objects are ``<prefix><session>/<turn>/<name>``, session and turn as digests of their
ids (as ``FileBlobStore`` names its directories), so a session's blobs are one key
prefix: deleting them lists that prefix and deletes a thousand keys a request. A
``put`` returns once S3 has the object (S3 writes are durable when acknowledged).

Every call is a blocking HTTP request on the store's path (the event loop's thread
for engine commits and reads): keep the bucket close to the process, and the
threshold high enough that only payloads worth a round trip go there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, StoreError
from .blobs import blob_key, check_name

try:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("turnkit.stores.s3 needs boto3: pip install 'turnkit[s3]'") from exc

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

_MISSING = {"NoSuchKey", "404", "NotFound"}


class S3BlobStore:
    """Blobs as objects in ``bucket`` under ``prefix``.

    ``client`` is a boto3 S3 client (made from ``client_options``, such as
    ``endpoint_url=`` for a MinIO or other S3-compatible server, when not given).
    The bucket must exist; the store never creates or configures one.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "turnkit-blobs/",
        client: S3Client | None = None,
        **client_options: Any,
    ) -> None:
        if not bucket:
            raise ConfigurationError("S3BlobStore needs a bucket")
        if prefix and not prefix.endswith("/"):
            raise ConfigurationError(f"S3BlobStore prefix must end with '/', got {prefix!r}")
        self.bucket = bucket
        self.prefix = prefix
        self._client: S3Client = client or boto3.client("s3", **client_options)

    def __repr__(self) -> str:
        return f"S3BlobStore({self.bucket!r}, prefix={self.prefix!r})"

    def _session_prefix(self, session_id: str) -> str:
        return f"{self.prefix}{blob_key(session_id)}/"

    def _key(self, session_id: str, turn_id: str, name: str) -> str:
        check_name(session_id, name)
        return f"{self._session_prefix(session_id)}{blob_key(turn_id)}/{name}"

    def put(self, session_id: str, turn_id: str, name: str, data: bytes) -> None:
        key = self._key(session_id, turn_id, name)
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except (BotoCoreError, ClientError) as exc:
            raise StoreError(f"session {session_id}: cannot write blob {name}: {exc}") from exc

    def get(self, session_id: str, turn_id: str, name: str) -> bytes | None:
        key = self._key(session_id, turn_id, name)
        try:
            found = self._client.get_object(Bucket=self.bucket, Key=key)
            return found["Body"].read()
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in _MISSING:
                return None
            raise StoreError(f"session {session_id}: cannot read blob {name}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"session {session_id}: cannot read blob {name}: {exc}") from exc

    def delete_turns(self, session_id: str, turn_ids: Iterable[str]) -> None:
        session = self._session_prefix(session_id)
        for turn_id in turn_ids:
            self._delete_prefix(session_id, f"{session}{blob_key(turn_id)}/")

    def delete_session(self, session_id: str) -> None:
        self._delete_prefix(session_id, self._session_prefix(session_id))

    def _delete_prefix(self, session_id: str, prefix: str) -> None:
        """Delete every object under ``prefix``, a listed page (up to 1,000) a request."""
        try:
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=prefix):
                keys: list[ObjectIdentifierTypeDef] = [
                    {"Key": o["Key"]} for o in page.get("Contents", []) if "Key" in o
                ]
                if not keys:
                    continue
                done = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True}
                )
                if done.get("Errors"):
                    first = done["Errors"][0]
                    raise StoreError(
                        f"session {session_id}: cannot delete blob {first.get('Key')}: "
                        f"{first.get('Code')} {first.get('Message')}"
                    )
        except (BotoCoreError, ClientError) as exc:
            raise StoreError(f"session {session_id}: cannot delete blobs: {exc}") from exc
