"""The simulated region's clients (``sim.clients``): the real decision, and the naive team's
value-threshold rule, both failing safe without fresh targets."""

from __future__ import annotations

from schemas.contract import ControlTargets, RmaTarget, SbmTarget
from sim.clients import NaiveClient, SurplusClient
from sim.scenario import ClientConfigPart, NaiveConfig
from workers.api import ServerState


def _targets(extra: int, coverage: float) -> ControlTargets:
    return ControlTargets(scope="eu1", epoch=1, issued_at_ms=0, ttl_ms=60_000,
                          rma=RmaTarget(extra_candidates=extra, budget_units_per_s=1e6),
                          sbm=SbmTarget(coverage=coverage))


def test_the_naive_client_without_targets_sends_baseline_work_only() -> None:
    client = NaiveClient("eu1", ClientConfigPart(), NaiveConfig())
    decision = client.decide("all", 0.9, 100, 0)
    assert (decision.model, decision.extra) == ("baseline", 0)
    assert client.counters()["baseline_only"] == {decision.targets_reason: 1}


def test_the_naive_client_asks_the_targets_extras_within_what_retrieval_offers() -> None:
    client = NaiveClient("eu1", ClientConfigPart(), NaiveConfig())
    client.offer(_targets(extra=30, coverage=0.0), 0)
    assert client.decide("all", 0.1, 100, 1).extra == 30
    assert client.decide("all", 0.1, 12, 2).extra == 12


def test_the_naive_client_routes_valuable_requests_to_the_powerful_model_up_to_coverage() -> None:
    naive = NaiveConfig()
    client = NaiveClient("eu1", ClientConfigPart(), naive)
    client.offer(_targets(extra=0, coverage=0.25), 0)
    high, low = naive.value_threshold + 0.1, naive.value_threshold - 0.1
    assert client.decide("all", low, 0, 1).model == "baseline"   # under the threshold
    models = [client.decide("all", high, 0, 2 + i).model for i in range(400)]
    share = models.count("powerful") / len(models)
    assert 0.2 < share < 0.3   # the coverage, not every valuable request
    assert client.counters()["sbm_routed"] == {"value_threshold": models.count("powerful")}


def test_the_naive_client_counts_failed_calls_by_error() -> None:
    client = NaiveClient("eu1", ClientConfigPart(), NaiveConfig())
    client.observe(None, 0, error="timeout", model="powerful")
    client.observe(ServerState(queue_delay_ms=1.0, in_flight=0, shedding_level=0,
                               preempted=False), 0)
    assert client.counters()["errors"] == {"timeout": 1}


def test_the_surplus_client_is_the_live_decision_failing_safe_without_targets() -> None:
    client = SurplusClient("eu1", ClientConfigPart(holdout_fraction=0.0), powerful=True,
                           seed=1)
    decision = client.decide("all", 0.9, 100, 0, "eu1-0")
    assert (decision.model, decision.extra) == ("baseline", 0)
    client.offer(_targets(extra=20, coverage=0.0), 0)
    assert client.decide("all", 0.9, 100, 1, "eu1-1").extra == 20
    counters = client.counters()
    assert counters["baseline_only"] == {"no_targets": 1}
    assert (counters["targets"], counters["rma_granted"]) == ({"applied": 1}, {"units": 20})
