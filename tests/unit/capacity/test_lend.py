"""When a replica's agent grants, renews and revokes its share: a grant once the worker serves,
a renewal every renew_s inside the lease, a new grant when the share changes, a revoke on a
reclaim (and never a grant after) and at exit; nothing counts until the broker took it."""

from __future__ import annotations

import pytest

from schemas.codec import decode, encode
from schemas.contract import REPLICA_GRANT_VERSION, CapacityEvent
from workers.capacity.lend import Lender, LendSettings, WorkerProbe, serving
from workers.capacity.platform import Identity, Share

POOL = "eu1/rank/baseline/a10g/opportunistic"
IDENT = Identity(region="eu1", service="rank", model="baseline", accelerator="a10g",
                 tier="opportunistic")
SHARE = Share(identity=IDENT, accelerator_units=1.0, cpu_units=4.0)


def _lender() -> Lender:
    return Lender("w1", LendSettings(lease_s=15.0, renew_s=5.0))


def _taken(lender: Lender, events: list[CapacityEvent]) -> list[CapacityEvent]:
    for event in events:
        lender.sent(event)
    return events


def test_a_grant_names_the_replica_its_units_and_a_lease_on_the_wire() -> None:
    (grant,) = _lender().tick(1_000, SHARE, True)
    assert (grant.kind, grant.pool_id, grant.region, grant.accelerator) == \
        ("grant", POOL, "eu1", "a10g")
    assert (grant.replica, grant.v) == ("w1", REPLICA_GRANT_VERSION)
    assert (grant.accelerator_units, grant.cpu_units) == (1.0, 4.0)
    assert grant.expires_at_ms == 16_000
    assert decode(CapacityEvent, encode(grant)) == grant


def test_renews_every_renew_s_while_the_worker_serves() -> None:
    lender = _lender()
    times = [t for t in range(0, 21_000, 1_000) if _taken(lender, lender.tick(t, SHARE, True))]
    assert times == [0, 5_000, 10_000, 15_000, 20_000]


def test_a_grant_the_broker_did_not_take_is_decided_again_at_the_next_tick() -> None:
    lender = _lender()
    assert len(lender.tick(0, SHARE, True)) == 1             # not confirmed
    (again,) = _taken(lender, lender.tick(2_000, SHARE, True))
    assert again.ts_ms == 2_000 and lender.granted_ms == 2_000
    assert lender.tick(4_000, SHARE, True) == []


def test_a_changed_share_is_granted_at_once() -> None:
    lender = _lender()
    _taken(lender, lender.tick(0, SHARE, True))
    halved = Share(identity=IDENT, accelerator_units=1.0, cpu_units=2.0)
    (grant,) = _taken(lender, lender.tick(1_000, halved, True))
    assert grant.cpu_units == 2.0


def test_no_grant_before_the_worker_serves_and_no_renewal_while_it_does_not() -> None:
    lender = _lender()
    assert lender.tick(0, SHARE, False) == []
    _taken(lender, lender.tick(1_000, SHARE, True))
    assert lender.tick(9_000, SHARE, False) == []   # renewal due, not made: the lease ends it
    assert lender.held                               # and nothing revoked for a blip


def test_a_reclaim_revokes_now_and_nothing_is_granted_after() -> None:
    lender = _lender()
    _taken(lender, lender.tick(0, SHARE, True))
    (revoke,) = _taken(lender, lender.reclaim(3_000))
    assert (revoke.kind, revoke.pool_id, revoke.replica, revoke.ts_ms) == \
        ("revoke", POOL, "w1", 3_000)
    assert lender.tick(10_000, SHARE, True) == [] and lender.granted is None
    assert lender.stop(11_000) == []                  # revoked already


def test_a_revoke_the_broker_did_not_take_is_repeated() -> None:
    lender = _lender()
    _taken(lender, lender.tick(0, SHARE, True))
    assert [e.kind for e in lender.reclaim(3_000)] == ["revoke"]      # not confirmed
    assert [e.kind for e in lender.tick(5_000, SHARE, True)] == ["revoke"]


def test_exit_revokes_even_a_grant_the_broker_never_confirmed() -> None:
    lender = _lender()
    lender.tick(0, SHARE, True)                      # may or may not be on the topic
    assert [e.kind for e in lender.stop(1_000)] == ["revoke"]


def test_nothing_to_lend_revokes_and_a_new_pool_revokes_the_old_first() -> None:
    lender = _lender()
    _taken(lender, lender.tick(0, SHARE, True))
    moved = Share(identity=Identity(region="eu1", service="rank", model="powerful",
                                    accelerator="a10g", tier="opportunistic"),
                  accelerator_units=1.0, cpu_units=4.0)
    revoke, grant = _taken(lender, lender.tick(1_000, moved, True))
    assert (revoke.kind, revoke.pool_id) == ("revoke", POOL)
    assert (grant.kind, grant.pool_id) == ("grant", moved.pool_id)
    empty = Share(identity=moved.identity, accelerator_units=0.0, cpu_units=0.0)
    assert [e.kind for e in _taken(lender, lender.tick(2_000, empty, True))] == ["revoke"]
    assert lender.tick(3_000, None, True) == []


def test_a_baseline_replica_lends_nothing() -> None:
    baseline = Share(identity=Identity(region="eu1", service="rank", model="baseline",
                                       accelerator="cpu", tier="baseline"),
                     accelerator_units=1.0, cpu_units=2.0)
    assert _lender().tick(0, baseline, True) == []


def test_the_lease_must_outlast_two_renewals() -> None:
    with pytest.raises(ValueError, match="lease_s"):
        LendSettings(lease_s=8.0, renew_s=5.0)
    with pytest.raises(ValueError, match="renew_s"):
        LendSettings(lease_s=8.0, renew_s=0.0)


def test_the_worker_serves_when_ready_for_the_same_pool() -> None:
    assert serving(None, POOL) == (True, None)
    assert serving(WorkerProbe(ready=True, pool_id=POOL), POOL) == (True, None)
    ok, why = serving(WorkerProbe(ready=False, detail="/readyz 503"), POOL)
    assert not ok and "/readyz 503" in (why or "")
    ok, why = serving(WorkerProbe(ready=True, pool_id="eu1/rank/baseline/cpu/opportunistic"),
                      POOL)
    assert not ok and "--pool eu1/rank/baseline/cpu/opportunistic" in (why or "")
