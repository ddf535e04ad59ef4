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


def test_replica_grants_add_up_to_the_pool_and_each_lapses_on_its_own_lease() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=1.0, cpu=4.0, ts_ms=0, expires_at_ms=15_000, replica="w1"))
    inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=5_000, expires_at_ms=20_000, replica="w2"))
    assert inv.available("eu1", 10_000) == CapacityVector(cpu_units=6.0, accel={"a100": 2.0})
    assert inv.available("eu1", 15_000) == CapacityVector(cpu_units=2.0, accel={"a100": 1.0})
    inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=14_000, expires_at_ms=29_000, replica="w2"))
    assert inv.expire(20_000) == [f"{RANK_POOL}#w1"]       # w2 renewed, w1 did not
    assert inv.available("eu1", 28_999).accel == {"a100": 1.0}
    assert inv.knows(RANK_POOL) and list(inv.replica_grants(RANK_POOL)) == ["w2"]


def test_a_replicas_revoke_drops_its_share_only_and_a_pool_revoke_drops_every_share() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=4.0, cpu=16.0))                              # a scheduler's
    inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=1, replica="w1"))
    inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=1, replica="w2"))
    inv.apply(grant(kind="revoke", ts_ms=2, replica="w1"))
    assert inv.available("eu1", 2) == CapacityVector(cpu_units=18.0, accel={"a100": 5.0})
    inv.apply(grant(kind="revoke", ts_ms=3))
    assert inv.available("eu1", 3) == CapacityVector() and not inv.knows(RANK_POOL)


def test_a_notice_naming_a_granting_replica_drops_its_share_and_spares_the_others() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=0, replica="w1"))
    inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=0, replica="w2"))
    inv.preempt(notice(replicas=("w1",), ts_ms=5))              # priced by w1's own grant
    assert inv.available("eu1", 5) == CapacityVector(cpu_units=2.0, accel={"a100": 1.0})
    assert not inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=4, replica="w2"))  # reordered, stale
    assert inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=6, replica="w2"))
    inv.preempt(notice(ts_ms=7))                                 # the whole pool
    assert inv.available("eu1", 7) == CapacityVector()


def test_a_notice_takes_only_the_units_beyond_the_replica_grants_off_the_pool_grant() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=4.0, cpu=16.0))
    inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=1, replica="w9"))
    inv.preempt(notice(replicas=("w9", "w3"), accel=2.0, cpu=6.0, ts_ms=5))
    assert inv.available("eu1", 5) == CapacityVector(cpu_units=12.0, accel={"a100": 3.0})


def test_an_unpriced_notice_for_a_granting_replica_leaves_the_pool_grant() -> None:
    inv = PoolInventory()
    inv.apply(grant(accel=4.0, cpu=16.0))
    inv.apply(grant(accel=1.0, cpu=2.0, ts_ms=1, replica="w9"))
    inv.preempt(notice(replicas=("w9",), ts_ms=5))     # a worker's SIGTERM notice, no units
    assert inv.available("eu1", 5) == CapacityVector(cpu_units=16.0, accel={"a100": 4.0})
    inv.preempt(notice(replicas=("w3",), ts_ms=6))     # a replica with no grant of its own
    assert inv.available("eu1", 6) == CapacityVector()


def test_replica_grants_survive_a_restart_and_a_state_without_them_omits_the_field() -> None:
    inv = PoolInventory()
    inv.apply(grant(T4_POOL, accel=1.5))
    assert b"replica_grants" not in msgspec.json.encode(inv.state)   # what an older one reads
    inv.apply(grant(accel=1.0, cpu=2.0, expires_at_ms=15_000, replica="w1"))
    state = msgspec.json.decode(msgspec.json.encode(inv.state), type=InventoryState)
    restored = PoolInventory(state)
    assert restored.state == inv.state
    assert restored.available("eu1", 10) == CapacityVector(cpu_units=18.0,
                                                           accel={"a100": 1.0, "t4": 1.5})
