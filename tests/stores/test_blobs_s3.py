"""``S3BlobStore`` against a real S3-compatible server: moto's server mode, run as a
subprocess on 127.0.0.1, driven through boto3 as any S3 endpoint would be."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually_blocking
from test_blobs import MARK, THRESHOLD, blob_agent

import turnkit
from turnkit import StoreError
from turnkit.stores import SqliteStore

pytest.importorskip("moto")
boto3 = pytest.importorskip("boto3")

from turnkit.stores.s3 import S3BlobStore  # noqa: E402

DAY = 86400.0
BUCKET = "turnkit-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            assert server.poll() is None, "moto's server exited"
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True

        eventually_blocking(listening, what="moto's server listening", ignoring=(OSError,))
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    client.create_bucket(Bucket=BUCKET)
    yield client
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    for key in keys:
        client.delete_object(Bucket=BUCKET, Key=key)
    client.delete_bucket(Bucket=BUCKET)


def objects(client: Any, prefix: str = "") -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def store(tmp_path: Path, client: Any) -> SqliteStore:
    blobs = S3BlobStore(BUCKET, prefix="app/", client=client)
    return SqliteStore(tmp_path / "t.db", blobs=blobs, blob_threshold=THRESHOLD)


async def test_large_results_live_in_the_bucket_and_go_with_their_session(
    tmp_path: Path, s3: Any
) -> None:
    keep = turnkit.Retention(archives_for=timedelta(days=30))
    async with turnkit.Runtime(blob_agent(), store=store(tmp_path, s3), retention=keep) as rt:
        for sid in ("s1", "s2"):
            session = rt.session("a", sid)
            await session.result(session.start("fetch alpha"))
            await session.reset()
            done = await session.result(session.start("fetch beta"))
            assert done.text == "saw 20000 chars of beta"
        assert len(objects(s3, "app/")) == 4  # one per turn that fetched
        body = s3.get_object(Bucket=BUCKET, Key=objects(s3)[0])["Body"].read()
        assert MARK.encode() in body  # the bucket holds what no row does
        report = await rt.prune(now=time.time() + 31 * DAY)  # the archived generations
        assert report.generations == 2 and len(objects(s3)) == 2
        await rt.session("a", "s1").erase(by="alice")
        assert len(objects(s3)) == 1
    async with turnkit.Runtime(blob_agent(), store=store(tmp_path, s3)) as rt:  # a new process
        snap = await rt.store.session("s2").load()
        assert any(MARK in str(m.to_dict()) for m in snap.messages)


async def test_a_missing_object_is_a_clear_error(tmp_path: Path, s3: Any) -> None:
    async with turnkit.Runtime(blob_agent(), store=store(tmp_path, s3)) as rt:
        session = rt.session("a", "s1")
        await session.result(session.start("fetch gamma"))
        for key in objects(s3):
            s3.delete_object(Bucket=BUCKET, Key=key)
        with pytest.raises(StoreError, match=r"session s1: .* refers to blob [0-9a-f]{64}"):
            await rt.store.session("s1").load()


@pytest.mark.slow  # a thousand requests to moto
def test_deleting_a_session_pages_through_its_objects(s3: Any) -> None:
    blobs = S3BlobStore(BUCKET, client=s3)
    with ThreadPoolExecutor(8) as pool:  # past one listing page and one delete request
        list(pool.map(lambda i: blobs.put("s1", f"t{i % 3}", f"{i:064x}", b"x"), range(1_001)))
    blobs.put("s2", "t0", "f" * 64, b"kept")
    blobs.delete_turns("s1", ["t0"])
    assert len(objects(s3)) == 1_001 - 334 + 1
    blobs.delete_session("s1")
    assert [key.startswith(blobs._session_prefix("s2")) for key in objects(s3)] == [True]
    assert blobs.get("s2", "t0", "f" * 64) == b"kept"
    assert blobs.get("s1", "t1", f"{1:064x}") is None


def test_s3_blob_store_refuses_bad_settings(s3: Any) -> None:
    with pytest.raises(turnkit.ConfigurationError, match="bucket"):
        S3BlobStore("", client=s3)
    with pytest.raises(turnkit.ConfigurationError, match="prefix"):
        S3BlobStore(BUCKET, prefix="no-slash", client=s3)
    with pytest.raises(StoreError, match="not a blob name"):
        S3BlobStore(BUCKET, client=s3).get("s1", "t", "../x")
