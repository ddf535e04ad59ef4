"""The control plane's Prometheus series say what limits each lever (no broker needed)."""

from __future__ import annotations

from schemas.contract import ControlTargets, RmaTarget, SbmTarget
from streams.agents.metrics import Metrics


def _targets(rma_why: str, sbm_why: str) -> ControlTargets:
    return ControlTargets(scope="eu1", epoch=1, issued_at_ms=0, ttl_ms=1000,
                          rma=RmaTarget(extra_candidates=8, budget_units_per_s=400.0,
                                        limited_by=rma_why),  # type: ignore[arg-type]
                          sbm=SbmTarget(coverage=0.2, limited_by=sbm_why))  # type: ignore[arg-type]


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_each_lever_shows_one_limiting_reason_and_counts_targets_by_it() -> None:
    metrics = Metrics()
    metrics.observe_targets(_targets("budget", "sla"))
    metrics.observe_targets(_targets("sla", "sla"))
    assert _value(metrics, "surplus_control_limited_by", scope="eu1", lever="rma",
                  reason="sla") == 1.0
    assert _value(metrics, "surplus_control_limited_by", scope="eu1", lever="rma",
                  reason="budget") == 0.0
    assert _value(metrics, "surplus_control_limited_targets_total", scope="eu1", lever="sbm",
                  reason="sla") == 2.0
    assert _value(metrics, "surplus_control_rma_budget_units_per_second", scope="eu1") == 400.0
    assert _value(metrics, "surplus_control_extra_candidates", scope="eu1") == 8.0


def test_acknowledged_targets_are_counted_and_the_highest_epoch_only_grows() -> None:
    metrics = Metrics()
    first, second = _targets("sla", "sla"), _targets("sla", "sla")
    second = ControlTargets(scope="eu1", epoch=2, issued_at_ms=0, ttl_ms=1000,
                            rma=first.rma, sbm=first.sbm)
    metrics.observe_delivery(second, failed=False)
    metrics.observe_delivery(first, failed=False)  # an answer may come late: the epoch holds
    metrics.observe_delivery(first, failed=True)
    assert _value(metrics, "surplus_control_targets_acked_epoch", scope="eu1") == 2.0
    assert _value(metrics, "surplus_control_targets_delivered_total", scope="eu1",
                  outcome="acked") == 2.0
    assert _value(metrics, "surplus_control_targets_delivered_total", scope="eu1",
                  outcome="failed") == 1.0


def test_the_extras_a_powerful_request_may_carry_show_the_sbm_cap_when_one_is_set() -> None:
    metrics = Metrics()
    metrics.observe_targets(_targets("sla", "sla"))
    assert _value(metrics, "surplus_control_sbm_extra_candidates", scope="eu1") == 8.0
    capped = ControlTargets(v=5, scope="eu1", epoch=2, issued_at_ms=0, ttl_ms=1000,
                            rma=_targets("sla", "sla").rma,
                            sbm=SbmTarget(coverage=0.2, extra_candidates=3))
    metrics.observe_targets(capped)
    assert _value(metrics, "surplus_control_sbm_extra_candidates", scope="eu1") == 3.0
