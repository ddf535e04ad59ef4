"""The first stage of a scaled-out scope: a shard's reports summed per period into parts that
merge into the window one reader would have built."""

from __future__ import annotations

import msgspec
import pytest

from schemas.contract import WindowPartial
from streams.control.dispatch import Rejected
from streams.control.shards import SHARD_MEMORY_PERIODS, ShardWindows, period_end
from streams.control.windows import LatencyWindow, WindowSet
from tests.unit.control.factories import POWERFUL_POOL, RANK_POOL, REGION, report

PERIOD_MS = 5_000


def shard(name: str = "shard-0") -> ShardWindows:
    return ShardWindows(name, lambda scope: PERIOD_MS, min_samples=50, relative_accuracy=0.02,
                        max_pools=4)


def test_an_event_on_a_tick_belongs_to_the_period_that_tick_closes() -> None:
    assert period_end(5_000, PERIOD_MS) == 5_000
    assert period_end(5_001, PERIOD_MS) == 10_000
    assert period_end(1, PERIOD_MS) == 5_000


def test_parts_merged_from_two_shards_give_the_window_one_reader_builds() -> None:
    reports = [report(RANK_POOL, worker=f"w{i}", p99_ms=20.0 + 7 * i, samples=60 + i,
                      start_ms=1000 * i, end_ms=1000 * i + 900, capacity_rps=10.0 + i,
                      utilisation=0.1 * i, shed={"overload": i, "deadline": 1}, done=5 * i,
                      units_done=30 + i) for i in range(1, 5)]
    reports = [msgspec.structs.replace(r, v=13, precompute_utilisation=0.25 * i)
               for i, r in enumerate(reports)]
    one = WindowSet(50, 0.02)
    for r in reports:
        one.add(r)
    shards = [shard("shard-0"), shard("shard-1")]
    for i, r in enumerate(reports):
        shards[i % 2].take(r.worker_id, [r], at_ms=r.window_end_ms)
    merged = WindowSet(50, 0.02)
    for s in shards:
        for part in s.due(PERIOD_MS):
            for pool in part.pools:
                merged.add_partial(pool, part.region, part.shard)
    (alone,), (together,) = one.close(PERIOD_MS), merged.close(PERIOD_MS)
    assert alone.precompute_utilisation == pytest.approx(1.5 / 4)
    assert together.p99_ms == alone.p99_ms and together.samples == alone.samples
    assert together.reports == alone.reports == 4
    for field in ("request_rate", "shed_rate", "overload_shed_rate", "utilisation",
                  "capacity_rps", "busy_s", "units_rate", "optional_done_rate",
                  "precompute_utilisation"):
        assert getattr(together, field) == pytest.approx(getattr(alone, field), rel=1e-12)


def test_a_shard_speaks_for_a_period_it_read_nothing_in_while_the_scope_is_recent() -> None:
    s = shard()
    s.add(report(RANK_POOL, start_ms=0, end_ms=1000), at_ms=1_000)
    first = s.due(PERIOD_MS)
    assert [(p.period_end_ms, len(p.pools)) for p in first] == [(5_000, 1)]
    quiet = s.due(PERIOD_MS * (SHARD_MEMORY_PERIODS + 3))
    assert [p.period_end_ms for p in quiet] == [
        PERIOD_MS * k for k in range(2, SHARD_MEMORY_PERIODS + 2)]
    assert all(not p.pools for p in quiet)
    assert len(s) == 0 and s.due(PERIOD_MS * 40) == []  # silent long enough: forgotten


def test_a_report_after_its_period_was_sent_joins_the_open_period() -> None:
    s = shard()
    s.add(report(RANK_POOL), at_ms=4_000)
    assert [p.period_end_ms for p in s.due(5_000)] == [5_000]
    s.add(report(RANK_POOL, worker="late"), at_ms=4_999)  # its period is gone
    (part,) = s.due(10_000)
    assert part.period_end_ms == 10_000 and part.pools[0].reports == 1


def test_the_open_period_is_not_handed_over_before_it_ends() -> None:
    s = shard()
    s.add(report(RANK_POOL), at_ms=5_500)
    assert s.due(9_999) == []
    assert [p.period_end_ms for p in s.due(10_000)] == [10_000]


def test_parts_keep_each_scope_and_pool_apart_in_order() -> None:
    s = shard()
    s.add(report(POWERFUL_POOL), at_ms=100)
    s.add(report(RANK_POOL), at_ms=200)
    s.add(report("us1/rank/baseline/a100/opportunistic"), at_ms=300)
    parts = s.due(PERIOD_MS)
    assert [(p.region, [pool.pool_id for pool in p.pools]) for p in parts] == [
        (REGION, sorted([POWERFUL_POOL, RANK_POOL])),
        ("us1", ["us1/rank/baseline/a100/opportunistic"])]
    assert all(isinstance(p, WindowPartial) and p.shard == "shard-0" for p in parts)


def test_a_report_keyed_by_neither_its_replica_nor_its_scope_is_refused_whole() -> None:
    s = shard()
    good, other = report(RANK_POOL, worker="w1"), report(RANK_POOL, worker="w2")
    s.take("w1", [good], at_ms=1)
    s.take(REGION, [good, other], at_ms=1)  # a batch keyed by its scope
    with pytest.raises(Rejected) as refused:
        s.take("w1", [good, other], at_ms=1)
    assert refused.value.reason == "key_mismatch" and "'w2'" in str(refused.value)
    (part,) = s.due(PERIOD_MS)
    assert part.pools[0].reports == 3


def test_a_shard_refuses_what_the_controller_would_as_the_controller_does() -> None:
    s = shard()
    odd = report(RANK_POOL)
    odd = type(odd)(**{**{f: getattr(odd, f) for f in odd.__struct_fields__},
                       "latency_ms": type(odd.latency_ms)(
                           **{**{f: getattr(odd.latency_ms, f)
                                 for f in odd.latency_ms.__struct_fields__},
                              "relative_accuracy": 0.05})})
    with pytest.raises(Rejected) as refused:
        s.take("w1", [odd], at_ms=0)
    assert refused.value.reason == "SketchMismatch"
    for i in range(3):  # the refused report's pool is the fourth, as in the controller's
        s.take("w1", [report(f"{REGION}/rank/baseline/a100/p{i}")], at_ms=0)
    with pytest.raises(Rejected) as full:
        s.take("w1", [report(f"{REGION}/rank/baseline/a100/p9")], at_ms=0)
    assert full.value.reason == "TooManyPools"


def test_a_merged_sketch_round_trips_through_its_wire_form() -> None:
    window = LatencyWindow.for_report(report(RANK_POOL), 1, 0.02)
    for i in range(3):
        window.add(report(RANK_POOL, worker=f"w{i}", p99_ms=30.0 + 40 * i, samples=80))
    part = window.partial()
    assert part is not None and part.latency_ms.count == 240 and part.reports == 3
    again = LatencyWindow.for_report(report(RANK_POOL), 1, 0.02)
    again.add_partial(part, "shard-0")
    assert again.close(1000).p99_ms == window.close(1000).p99_ms
