"""The collector's pauses are on /metrics, and a frozen start-up heap is left out of them."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from schemas.build import register_standard_collectors
from schemas.heap import freeze_startup_heap


class _Cycle:
    """Garbage only the collector can free: it refers to itself."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()


def _full_collections(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("surplus_gc_pause_seconds_count",
                                     {"generation": "2"}) or 0.0


def test_each_full_collection_is_one_observed_pause_in_every_registry() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    register_standard_collectors(first)
    register_standard_collectors(second)
    before = _full_collections(first)
    gc.collect()
    gc.collect()
    assert _full_collections(first) == before + 2
    assert _full_collections(second) == _full_collections(first)  # one hook, however many ask
    assert (first.get_sample_value("surplus_gc_pause_seconds_sum", {"generation": "2"}) or 0) > 0


def test_objects_alive_at_freeze_are_exempt_from_later_collections(thawed: None) -> None:
    before = _Cycle()
    before_ref = weakref.ref(before)
    assert freeze_startup_heap() > 0
    after = _Cycle()
    after_ref = weakref.ref(after)
    del before, after
    gc.collect()
    assert after_ref() is None  # made after start-up: collected as usual
    assert before_ref() is not None  # frozen: the collector no longer walks it
