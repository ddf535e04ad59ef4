"""The live replica set: who a client routes to, on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.contract import PreemptionNotice, ReplicaAnnouncement
from workers.policy.membership import Membership, MembershipLimits

T0 = 1_700_000_000_000
LEASE = 3_000


def ann(replica: str = "w1", ts: int = T0, *, state: str = "serving", model: str = "baseline",
        region: str = "eu1", lease: int = LEASE, **extra: Any) -> ReplicaAnnouncement:
    return ReplicaAnnouncement(
        replica_id=replica, endpoint=f"http://{replica}:8080", region=region,
        pool_id=f"{region}/rank/{model}/cpu/opportunistic", tier="opportunistic",
        model=model, state=state, ts_ms=ts, lease_expires_at_ms=ts + lease,  # type: ignore[arg-type]
        **extra)


def test_an_announced_replica_is_routable_until_its_lease_runs_out() -> None:
    m = Membership("eu1")
    assert m.offer(ann(), T0 + 5) == "serving"
    assert m.routable("baseline", T0 + 5) == ("http://w1:8080",)
    assert m.routable("baseline", T0 + LEASE - 1) == ("http://w1:8080",)
    assert m.routable("baseline", T0 + LEASE) == ()


def test_renewal_extends_the_lease() -> None:
    m = Membership("eu1")
    m.offer(ann(ts=T0), T0)
    m.offer(ann(ts=T0 + 1_000), T0 + 1_000)
    assert m.routable("baseline", T0 + LEASE + 500) == ("http://w1:8080",)


def test_a_draining_replica_leaves_at_once_not_at_its_deadline() -> None:
    m = Membership("eu1")
    m.offer(ann(ts=T0), T0)
    assert m.offer(ann(ts=T0 + 10, state="draining", deadline_ms=T0 + 30_000), T0 + 10) \
        == "draining"
    assert m.routable("baseline", T0 + 10) == ()


def test_a_replica_lent_again_under_the_same_id_comes_back() -> None:
    m = Membership("eu1")
    m.offer(ann(ts=T0), T0)
    m.offer(ann(ts=T0 + 10, state="draining"), T0 + 10)
    m.offer(ann(ts=T0 + 20_000), T0 + 20_000)
    assert m.routable("baseline", T0 + 20_000) == ("http://w1:8080",)


def test_a_tombstone_removes_the_replica() -> None:
    m = Membership("eu1")
    m.offer(ann(), T0)
    assert m.withdraw("w1") == "tombstone"
    assert m.routable("baseline", T0) == ()
    assert m.withdraw("w1") == "tombstone_unknown"


def test_an_older_announcement_changes_nothing() -> None:
    m = Membership("eu1")
    m.offer(ann(ts=T0 + 100, state="draining"), T0 + 100)
    assert m.offer(ann(ts=T0), T0 + 150) == "older"
    assert m.routable("baseline", T0 + 150) == ()
    assert m.counters["older"] == 1


def test_other_regions_and_other_models_are_kept_apart() -> None:
    m = Membership("eu1")
    assert m.offer(ann("u1", region="us1"), T0) == "other_region"
    m.offer(ann("p1", model="powerful"), T0)
    m.offer(ann("b2"), T0)
    m.offer(ann("b1"), T0)
    assert m.routable("baseline", T0) == ("http://b1:8080", "http://b2:8080")
    assert m.routable("powerful", T0) == ("http://p1:8080",)


def test_an_announcement_whose_lease_has_run_out_on_arrival_admits_nothing() -> None:
    m = Membership("eu1")
    assert m.offer(ann(ts=T0), T0 + LEASE + 10) == "expired"
    assert m.routable("baseline", T0 + LEASE + 10) == ()


def test_a_lease_longer_than_the_local_bound_is_cut_to_it() -> None:
    m = Membership("eu1", MembershipLimits(max_lease_ms=2_000))
    m.offer(ann(lease=600_000), T0)
    assert m.routable("baseline", T0 + 1_999) != ()
    assert m.routable("baseline", T0 + 2_000) == ()


def test_an_announcement_from_beyond_the_skew_is_refused() -> None:
    m = Membership("eu1", MembershipLimits(max_clock_skew_ms=1_000))
    assert m.offer(ann(ts=T0 + 5_000), T0) == "from_future"
    assert m.routable("baseline", T0) == ()


@pytest.mark.parametrize("skew_ms", [-2_000, 2_000])
def test_a_skewed_client_drops_a_killed_replica_when_its_lease_ends_on_the_replicas_clock(
        skew_ms: int) -> None:
    """The client's clock runs ``skew_ms`` ahead of the replica's; transit is 5 ms. After the
    first announcement the offset is known, so expiry lands on the replica's lease end."""
    m = Membership("eu1")
    for i in range(3):
        m.offer(ann(ts=T0 + i * 1_000), T0 + i * 1_000 + skew_ms + 5)
    last_end = T0 + 2_000 + LEASE           # replica's clock
    assert m.routable("baseline", last_end + skew_ms) == ("http://w1:8080",)
    assert m.routable("baseline", last_end + skew_ms + 10) == ()


def test_the_routable_tuple_is_cached_until_something_changes() -> None:
    m = Membership("eu1")
    m.offer(ann(), T0)
    first = m.routable("baseline", T0)
    assert m.routable("baseline", T0 + 1) is first
    m.offer(ann("w2"), T0 + 2)
    assert m.routable("baseline", T0 + 2) == ("http://w1:8080", "http://w2:8080")


def test_long_expired_replicas_are_forgotten() -> None:
    m = Membership("eu1", MembershipLimits(max_lease_ms=LEASE))
    m.offer(ann(), T0)
    assert m.forget_expired(T0 + LEASE) == 0
    assert m.forget_expired(T0 + 2 * LEASE) == 1
    assert m.members() == {}


def test_a_notice_reaches_the_live_replicas_it_names_or_its_whole_pool() -> None:
    m = Membership()
    pool = "eu1/rank/baseline/cpu/opportunistic"
    m.offer(ann("w1"), T0)
    m.offer(ann("w2", state="draining"), T0)        # turned by an earlier notice: told again
    m.offer(ann("w3", model="powerful"), T0)        # another pool
    m.offer(ann("w4", ts=T0 - LEASE), T0)           # its lease ran out

    def notice(pool_id: str, replicas: list[str]) -> PreemptionNotice:
        return PreemptionNotice(notice_id="n", ts_ms=T0, region="eu1", pool_id=pool_id,
                                replicas=replicas, deadline_ms=T0 + 1_000)

    assert m.reclaimed(notice(pool, []), T0 + 1) == ("http://w1:8080", "http://w2:8080")
    assert m.reclaimed(notice(pool, ["w2", "w3"]), T0 + 1) == ("http://w2:8080",)
    assert m.reclaimed(notice("eu1/rank/baseline/cpu/baseline", []), T0 + 1) == ()
