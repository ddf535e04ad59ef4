from __future__ import annotations

import msgspec

from streams.control.inventory import CapacityVector, InventoryState, PoolInventory
from tests.unit.control.factories import POWERFUL_POOL, RANK_POOL, grant, notice

T4_POOL = "eu1/rank/baseline/t4/opportunistic"


def test_sums_live_grants_by_accelerator_type() -> None:
    inv = PoolInventory()
    inv.apply(grant(RANK_POOL, accel=4.0, cpu=16.0))
    inv.apply(grant(POWERFUL_POOL, accel=2.0, cpu=0.0))
    inv.apply(grant(T4_POOL, accel=3.0, cpu=8.0))
    inv.apply(grant("us2/rank/baseline/a100/opportunistic", accel=9.0, cpu=9.0))
    assert inv.available("eu1", 0) == CapacityVector(cpu_units=24.0,
                                                     accel={"a100": 6.0, "t4": 3.0})


def test_grant_lapses_at_expiry_unless_renewed() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=4.0, ts_ms=0, expires_at_ms=30_000))
    assert inv.available("eu1", 29_999).accel == {"a100": 4.0}
    assert inv.available("eu1", 30_000).accel == {}
    inv.apply(grant(accel=5.0, ts_ms=25_000, expires_at_ms=55_000))
    assert inv.available("eu1", 40_000).accel == {"a100": 5.0}   # renewal replaces
    assert inv.expire(55_000) == [RANK_POOL]
    assert inv.grant(RANK_POOL) is None


def test_revoke_removes_the_pool() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=4.0))
    inv.apply(grant(kind="revoke", ts_ms=1))
    assert inv.available("eu1", 1) == CapacityVector()


def test_whole_pool_preemption_removes_it_immediately() -> None:
    inv = PoolInventory()
    inv.apply(grant(RANK_POOL, accel=4.0, cpu=16.0, expires_at_ms=600_000))
    inv.apply(grant(POWERFUL_POOL, accel=2.0, cpu=0.0, expires_at_ms=600_000))
    inv.preempt(notice(POWERFUL_POOL, ts_ms=5))
    assert inv.available("eu1", 5) == CapacityVector(cpu_units=16.0, accel={"a100": 4.0})


def test_partial_preemption_subtracts_the_named_share() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=4.0, cpu=16.0))
    inv.preempt(notice(replicas=("w3",), accel=1.0, cpu=4.0, ts_ms=5))
    assert inv.available("eu1", 5) == CapacityVector(cpu_units=12.0, accel={"a100": 3.0})


def test_replicas_without_units_are_treated_as_the_whole_pool() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=4.0, cpu=16.0))
    inv.preempt(notice(replicas=("w3",), ts_ms=5))
    assert inv.available("eu1", 5) == CapacityVector()


def test_late_grant_older_than_preemption_does_not_resurrect_capacity() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=4.0, ts_ms=0))
    inv.preempt(notice(ts_ms=100))
    assert not inv.apply(grant(accel=4.0, ts_ms=90))     # reordered across topics
    assert inv.available("eu1", 100).accel == {}
    assert inv.apply(grant(accel=2.0, ts_ms=200))         # a real re-grant afterwards
    assert inv.available("eu1", 200).accel == {"a100": 2.0}


def test_state_round_trips_through_json() -> None:
    inv = PoolInventory()
    inv.apply(grant(RANK_POOL, accel=4.0, expires_at_ms=50_000))
    inv.apply(grant(T4_POOL, accel=1.5))
    inv.preempt(notice(POWERFUL_POOL, ts_ms=7))
    state = msgspec.json.decode(msgspec.json.encode(inv.state), type=InventoryState)
    restored = PoolInventory(state)
    assert restored.state == inv.state
    assert restored.available("eu1", 10) == inv.available("eu1", 10)
