"""``turnkit worker`` sets Python's cyclic garbage collector for a process that only
runs turns (``tune_collector``): start-up's objects frozen out of every collection,
young objects collected every 10,000 allocations, a threshold the agents set kept."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from turnkit.cli._worker import WORKER_GC_THRESHOLD, tune_collector


class _Node:
    next: _Node | None = None


@pytest.fixture
def collector() -> Iterator[None]:
    """Python's own settings before the test, and this process's restored after it."""
    threshold = gc.get_threshold()
    gc.set_threshold(700, *threshold[1:])
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_a_worker_collects_young_objects_every_10000_allocations(collector: None) -> None:
    rest = gc.get_threshold()[1:]
    tune_collector()
    assert gc.get_threshold() == (WORKER_GC_THRESHOLD, *rest)


def test_what_start_up_left_alive_is_frozen_and_its_garbage_collected_first(
    collector: None,
) -> None:
    kept: list[object] = [[]]
    cycle = _Node()
    cycle.next = cycle  # start-up garbage: unreachable once the name goes
    gone = weakref.ref(cycle)
    del cycle
    tune_collector()
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # in no generation a run walks
    assert gone() is None  # collected before the freeze, not frozen with the rest


def test_a_threshold_the_agents_code_set_is_kept(collector: None) -> None:
    gc.set_threshold(2_500, 15, 15)
    tune_collector()
    assert gc.get_threshold() == (2_500, 15, 15)
