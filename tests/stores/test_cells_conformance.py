"""The store conformance suite on ``Cells`` over two databases: a session the runtime
never placed lives in the home cell, so the suite's sessions are all in one cell,
and every read that lists (sessions, parked and due turns, usage) merges both."""

from __future__ import annotations

import pytest
from cells_support import CellPlaces, places, second_database

from turnkit.testing.conformance import *  # noqa: F403 - the suite's tests
from turnkit.testing.conformance import StoreUnderTest

__all__ = ["places", "second_database"]  # the fixtures, used by name


@pytest.fixture
def conformance_store(places: CellPlaces) -> StoreUnderTest:
    return StoreUnderTest(factory=lambda: places.cells(), sql=True)
