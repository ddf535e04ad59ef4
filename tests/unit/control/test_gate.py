"""The second stage of a scaled-out scope: a period closes once every shard it expects has
spoken, or when its grace runs out, saying who was missing."""

from __future__ import annotations

import pytest

from schemas.contract import PoolPartial, WindowPartial
from streams.control.gate import PeriodGate
from streams.control.shards import SHARD_MEMORY_PERIODS
from tests.unit.control.factories import RANK_POOL, REGION, sketch

PERIOD_MS, GRACE_MS = 1_000, 400


def part(shard: str, end_ms: int, *, reports: int = 1) -> WindowPartial:
    pools = [PoolPartial(pool_id=RANK_POOL, model="baseline", tier="opportunistic",
                         accelerator="a100", reports=reports, requests=10,
                         baseline_requests=10, first_start_ms=end_ms - PERIOD_MS,
                         last_end_ms=end_ms, latency_ms=sketch(20.0, 10))] if reports else []
    return WindowPartial(region=REGION, shard=shard, period_end_ms=end_ms, pools=pools)


def warm_gate(*shards: str) -> PeriodGate:
    """A gate past its first period, which knows ``shards`` (their parts of period 1 s)."""
    gate = PeriodGate(PERIOD_MS, GRACE_MS, start_ms=500)
    for shard in shards:
        gate.add(part(shard, 1_000))
    released = gate.release(1_000 + GRACE_MS)
    assert released is not None and released.period_end_ms == 1_000
    return gate


def test_a_period_closes_as_soon_as_its_last_expected_part_arrives() -> None:
    gate = warm_gate("a", "b")
    gate.add(part("a", 2_000))
    assert gate.release(2_010) is None  # b has not spoken yet
    gate.add(part("b", 2_000, reports=0))  # nothing to say, but it says so
    released = gate.release(2_020)
    assert released is not None and released.missing == ()
    assert [p.shard for p in released.parts] == ["a", "b"]


def test_a_silent_shard_holds_its_period_only_for_the_grace() -> None:
    gate = warm_gate("a", "b")
    gate.add(part("a", 2_000))
    assert gate.release(2_000 + GRACE_MS - 1) is None
    released = gate.release(2_000 + GRACE_MS)
    assert released is not None and released.missing == ("b",)
    assert [p.shard for p in released.parts] == ["a"]


def test_a_part_after_its_period_closed_joins_the_open_one_and_is_counted() -> None:
    gate = warm_gate("a", "b")
    gate.add(part("a", 2_000))
    gate.release(2_000 + GRACE_MS)
    gate.add(part("b", 2_000))  # late
    gate.add(part("a", 3_000))
    gate.add(part("b", 3_000))
    released = gate.release(3_005)
    assert gate.late == 1 and released is not None and released.period_end_ms == 3_000
    assert sorted((p.shard, p.period_end_ms) for p in released.parts) == [
        ("a", 3_000), ("b", 2_000), ("b", 3_000)]


def test_the_first_period_waits_out_the_grace_since_no_shard_is_known_yet() -> None:
    gate = PeriodGate(PERIOD_MS, GRACE_MS, start_ms=500)
    gate.add(part("a", 1_000))
    assert gate.release(1_100) is None
    released = gate.release(1_000 + GRACE_MS)
    assert released is not None and released.parts[0].shard == "a"


def test_a_scope_with_no_telemetry_still_closes_every_period() -> None:
    gate = warm_gate()
    assert gate.release(1_999) is None
    released = gate.release(2_000)
    assert released is not None and released.period_end_ms == 2_000 and released.parts == []


def test_periods_ready_together_close_as_one_tick() -> None:
    gate = warm_gate("a")
    for end in (2_000, 3_000, 4_000):
        gate.add(part("a", end))
    released = gate.release(4_500)  # not asked for a while: the periods ready merge
    assert released is not None and released.period_end_ms == 4_000
    assert [p.period_end_ms for p in released.parts] == [2_000, 3_000, 4_000]


def test_a_shard_silent_for_its_memory_is_no_longer_waited_for() -> None:
    gate = warm_gate("a", "b")
    end = 1_000
    for _ in range(SHARD_MEMORY_PERIODS):
        end += PERIOD_MS
        gate.add(part("a", end))
        gate.add(part("b", end, reports=0))
        assert gate.release(end) is not None
    end += PERIOD_MS
    gate.add(part("a", end))  # b's last report is now a memory ago: a stops there too
    released = gate.release(end)
    assert released is not None and released.missing == ()


def test_a_bad_period_or_grace_stops_the_gate_at_construction() -> None:
    with pytest.raises(ValueError, match="period_ms 0"):
        PeriodGate(0, 100, start_ms=0)
