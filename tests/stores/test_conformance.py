"""The store conformance suite (``turnkit.testing.conformance``) on every built-in store,
each also with every payload sealed by ``turnkit.crypto.EnvelopeCodec``.

This module is also the example of how a third-party store runs the suite: import
its tests and provide the ``conformance_store`` fixture.
"""

from __future__ import annotations

import os

import pytest

from turnkit import Codec
from turnkit.testing.conformance import *  # noqa: F403 - the suite's tests
from turnkit.testing.conformance import StoreUnderTest


@pytest.fixture(params=["plain", "aes"])
def store_codec(request: pytest.FixtureRequest) -> Codec | None:
    if request.param == "plain":
        return None
    from turnkit.crypto import EnvelopeCodec, KeyRing

    keys = KeyRing()
    keys.add("default", "k1", os.urandom(32))
    return EnvelopeCodec(keys)


@pytest.fixture
def conformance_store(store_kind: str, make_store: object) -> StoreUnderTest:
    # The in-memory store has no SQL handle by design; the suite then checks that it
    # lacks one honestly.
    return StoreUnderTest(factory=make_store, sql=store_kind != "memory")  # type: ignore[arg-type]
