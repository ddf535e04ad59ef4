"""The client's per-request decision: RMA count and SBM pool, every cut counted with a reason."""

from __future__ import annotations

import pytest

from schemas.signing import sign
from tests.unit.policy.helpers import T0, targets
from workers.api import ServerState
from workers.client.config import ClientConfig
from workers.client.decision import Decider, Decision
from workers.policy.client_shed import ShedConfig
from workers.policy.routing import RouterConfig

BASE = "http://127.0.0.1:1"
POWER = "http://127.0.0.1:2"


def _decider(powerful: bool = True, **kw: object) -> Decider:
    config = ClientConfig(scope="eu1", baseline_urls=[BASE],
                          powerful_urls=[POWER] if powerful else [], **kw)  # type: ignore[arg-type]
    return Decider(config)


def test_without_targets_every_request_is_baseline_with_no_extras() -> None:
    decider = _decider()
    for i in range(100):
        d = decider.decide("s", 500, T0 + i)
        assert (d.model, d.extra, d.targets_reason) == ("baseline", 0, "no_targets")
    assert decider.counters["baseline_only"] == {"no_targets": 100}


def test_extras_follow_the_target_and_what_the_caller_has() -> None:
    decider = _decider(powerful=False)
    decider.offer(targets(extra=64, budget=1e6), T0)
    decider.decide("s", 500, T0)               # the budget bucket starts empty, then fills
    assert decider.decide("s", 500, T0 + 1_000).extra == 64
    assert decider.decide("s", 10, T0 + 1_000).extra == 10
    assert decider.decide("s", 0, T0 + 1_000).extra == 0


def test_budget_caps_extras_and_the_cut_is_counted() -> None:
    decider = _decider(powerful=False, rma_budget_share=0.5, rma_burst_s=1.0)
    decider.offer(targets(extra=64, budget=200.0), T0)   # this client: 100 units/s
    decider.decide("s", 500, T0)
    granted = sum(decider.decide("s", 500, T0 + 1_000).extra for _ in range(10))
    assert granted == 100
    assert decider.counters["rma_granted"]["units"] == 100
    assert decider.counters["rma_shed"]["budget"] == 11 * 64 - 100   # incl. the empty start


def test_requests_the_powerful_pool_serves_whole_do_not_spend_the_rma_budget() -> None:
    decider = _decider(rma_burst_s=1.0, router=RouterConfig(explore_rate=0.0))
    decider.offer(targets(extra=64, budget=640.0, coverage=0.5), T0)   # 10 requests' worth
    first = decider.decide("s", 500, T0)              # from an empty bucket: no extras
    ds = [decider.decide("s", 500, T0 + 1_000) for _ in range(40)]
    powerful = [d for d in ds if d.model == "powerful"]
    ranking = [d for d in ds if d.model == "baseline"]
    assert powerful and all(d.extra == 64 for d in powerful)
    assert sum(d.extra for d in ranking) == 640   # the budget went to ranking requests only
    cut_first = 64 if first.model == "baseline" else 0
    assert decider.counters["rma_shed"]["budget"] == 64 * len(ranking) - 640 + cut_first


def test_a_cap_on_powerful_extras_cuts_those_requests_only_and_counts_the_cut() -> None:
    decider = _decider(rma_burst_s=1.0, router=RouterConfig(explore_rate=0.0))
    decider.offer(targets(extra=64, budget=1e9, coverage=0.5, powerful_extra=16), T0)
    ds = [decider.decide("s", 500, T0 + 1_000) for _ in range(40)]
    powerful = [d for d in ds if d.model == "powerful"]
    ranking = [d for d in ds if d.model == "baseline"]
    assert powerful and all(d.extra == 16 for d in powerful)
    assert ranking and all(d.extra == 64 for d in ranking)
    assert decider.counters["rma_shed"]["over_target"] == 48 * len(powerful)
    assert decider.decide("s", 10, T0 + 1_000).extra == 10   # under the cap: what it has


def _struggling(model: str) -> tuple[Decider, list[Decision]]:
    """A decider whose `model` pool just reported shedding level 3 (a 0.5 cut)."""
    decider = _decider(shed=ShedConfig(level_factors=(0.5, 0.5, 0.5)),
                       router=RouterConfig(explore_rate=0.0))
    decider.offer(targets(extra=64, budget=1e9, coverage=0.6), T0)
    decider.decide("s", 500, T0)
    decider.observe(ServerState(queue_delay_ms=1.0, in_flight=1, shedding_level=3), T0 + 1,
                    model=model)  # type: ignore[arg-type]
    return decider, [decider.decide("s", 500, T0 + 2) for _ in range(20_000)]


def test_a_struggling_ranking_worker_shrinks_extras_only_and_counts_them() -> None:
    decider, ds = _struggling("baseline")
    ranking = [d for d in ds if d.model == "baseline"]
    assert {d.extra for d in ranking} == {32}
    assert {d.extra for d in ds if d.model == "powerful"} == {64}
    assert decider.counters["rma_shed"]["overload"] == 32 * len(ranking)
    assert sum(d.model == "powerful" for d in ds) / len(ds) == pytest.approx(0.6, abs=0.02)
    assert "sbm_shed" not in decider.counters


def test_a_struggling_powerful_worker_shrinks_coverage_not_the_ranking_extras() -> None:
    decider, ds = _struggling("powerful")
    assert {d.extra for d in ds if d.model == "baseline"} == {64}
    assert {d.extra for d in ds if d.model == "powerful"} == {32}
    powerful = sum(d.model == "powerful" for d in ds) / len(ds)
    assert powerful == pytest.approx(0.3, abs=0.02)
    assert decider.counters["sbm_shed"]["overload"] == pytest.approx(0.3 * 20_000, rel=0.1)
    assert decider.shed_counters() == {"powerful": {"cuts": 1, "shedding_level_3": 1}}


def test_coverage_is_met_and_counted_by_exploit_and_explore() -> None:
    decider = _decider()
    decider.offer(targets(coverage=0.25, segments={"a": (0.1, 0.01), "b": (0.0, 0.01)}), T0)
    ds = [decider.decide("ab"[i % 2], 0, T0) for i in range(40_000)]
    assert sum(d.model == "powerful" for d in ds) / len(ds) == pytest.approx(0.25, abs=0.01)
    routed = decider.counters["sbm_routed"]
    assert routed["explored"] / (routed["explored"] + routed["exploited"]) == \
        pytest.approx(0.05, abs=0.01)


def test_without_a_powerful_pool_nothing_is_routed_powerful() -> None:
    decider = _decider(powerful=False)
    decider.offer(targets(coverage=1.0), T0)
    assert all(decider.decide("s", 0, T0).model == "baseline" for _ in range(1_000))


def test_expired_targets_go_back_to_baseline_only() -> None:
    decider = _decider()
    decider.offer(targets(coverage=1.0, extra=8, ttl_ms=1_000), T0)
    assert decider.decide("s", 100, T0 + 500).model == "powerful"
    d = decider.decide("s", 100, T0 + 1_000)
    assert (d.model, d.extra, d.targets_reason) == ("baseline", 0, "expired")


def test_signing_key_refuses_unsigned_targets_and_takes_signed_ones() -> None:
    config = ClientConfig(scope="eu1", baseline_urls=[BASE], powerful_urls=[POWER])
    decider = Decider(config, signing_key=b"k")
    assert decider.offer(targets(coverage=1.0), T0).reason == "unsigned"
    assert decider.decide("s", 0, T0).model == "baseline"
    assert decider.offer(sign(targets(coverage=1.0), b"k"), T0).accepted
    assert decider.decide("s", 0, T0).model == "powerful"


def test_config_loads_from_toml_with_nested_policies_and_names_bad_keys() -> None:
    import msgspec

    config = msgspec.toml.decode(b"""
scope = "eu1"
baseline_urls = ["http://10.0.0.1:8080"]
powerful_urls = ["http://10.0.0.2:8080"]
[router]
explore_rate = 0.1
[limits]
max_coverage = 0.5
""", type=ClientConfig)
    assert config.router.explore_rate == 0.1 and config.limits.max_coverage == 0.5
    with pytest.raises(msgspec.ValidationError, match="explore_rat"):
        msgspec.toml.decode(b'scope="eu1"\nbaseline_urls=["http://a"]\n[router]\nexplore_rat=1\n',
                            type=ClientConfig)
    with pytest.raises(msgspec.ValidationError, match="baseline_urls"):
        msgspec.toml.decode(b'scope="eu1"\nbaseline_urls=["ftp://a"]\n', type=ClientConfig)


def test_each_decision_carries_the_gain_replicas_shed_it_by() -> None:
    """Powerful requests carry their segment's expected gain from the powerful model; ranking
    requests with extras the marginal value of their last extra candidate, which falls as
    extras grow; a request without optional work carries none."""
    decider = _decider(router=RouterConfig(explore_rate=0.0))
    decider.offer(targets(extra=8, budget=1e6, coverage=1.0,
                          segments={"new": (0.3, 0.01), "loyal": (0.02, 0.01)}), T0)
    routed = {d.gain for i in range(200) for seg in ("new", "loyal")
              if (d := decider.decide(seg, 500, T0 + i)).model == "powerful"}
    assert any(g == pytest.approx(0.3, abs=0.01) for g in routed if g is not None)
    assert any(g == pytest.approx(0.02, abs=0.01) for g in routed if g is not None)
    ranking = _decider(powerful=False)
    ranking.offer(targets(extra=64, budget=1e6), T0)
    ranking.decide("s", 500, T0)
    few, many = ranking.decide("s", 4, T0 + 1_000), ranking.decide("s", 60, T0 + 1_000)
    assert (few.extra, many.extra) == (4, 60)
    assert few.gain is not None and many.gain is not None and few.gain > many.gain
    assert ranking.decide("s", 0, T0 + 1_000).gain is None


def _room(room: int) -> ServerState:
    return ServerState(queue_delay_ms=0.0, in_flight=0, shedding_level=0, optional_room=room)


def test_extras_are_sized_to_the_replica_room_once_a_period_has_ended() -> None:
    decider = _decider(powerful=False, rma_burst_s=1.0)
    decider.offer(targets(extra=64, budget=1e4), T0)
    decider.observe(_room(20), T0, replica="http://a")
    decider.observe(_room(80), T0, replica="http://b")
    assert decider.fit_to_replica("http://a", 64) == 64      # no period ended yet
    decider.offer(targets(epoch=2, issued_at_ms=T0 + 5_000, extra=64, budget=1e4), T0 + 5_000)
    assert decider.fit_to_replica("http://a", 64) == 20
    assert decider.fit_to_replica("http://b", 64) == 64
    assert decider.counters["rma_shed"]["room"] == 44


def test_extras_cut_for_room_are_not_given_back_to_the_budget() -> None:
    decider = _decider(powerful=False, rma_burst_s=1.0)
    decider.offer(targets(extra=64, budget=128.0), T0)
    decider.observe(_room(0), T0, replica="http://a")
    decider.offer(targets(epoch=2, issued_at_ms=T0 + 1, extra=64, budget=128.0), T0 + 1)
    granted = decider.decide("s", 500, T0 + 1_000).extra
    assert granted == 64
    assert decider.fit_to_replica("http://a", granted) == 0
    after = [decider.decide("s", 500, T0 + 1_000).extra for _ in range(2)]
    assert after == [64, 0]       # 64 left of the 128: the cut was spent


def test_a_hedge_is_sized_but_its_cut_is_not_counted_twice() -> None:
    decider = _decider(powerful=False)
    decider.offer(targets(extra=64, budget=1e4), T0)
    decider.observe(_room(10), T0, replica="http://a")
    decider.offer(targets(epoch=2, issued_at_ms=T0 + 1, extra=64, budget=1e4), T0 + 1)
    assert decider.fit_to_replica("http://a", 64) == 10
    assert decider.fit_to_replica("http://a", 64, counted=False) == 10
    assert decider.counters["rma_shed"]["room"] == 54


def test_a_powerful_replica_room_is_not_learned_for_ranking() -> None:
    decider = _decider()
    decider.observe(_room(0), T0, model="powerful", replica=POWER)
    decider.rooms.new_period()
    assert decider.rooms.cap(POWER) is None
