"""The broker stops for 30 s in the middle of a run and comes back.

Workers keep serving baseline throughout; held targets lapse at their TTL so optional work
stops (counted, by reason); no process crashes; once the broker is back the control plane
publishes again, optional work resumes, and the time that took is printed.

Uses a broker of its own: the session broker is never stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schemas.kafka_config import KafkaSettings
from surplus import localkafka
from tests.faults.conftest import Figures
from tests.faults.fleet import Fleet, figures_of
from tests.integration.fleet import by_label

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]

OUTAGE_S = 30.0


def test_broker_outage_keeps_baseline_expires_targets_and_recovers(
        own_broker: tuple[KafkaSettings, Path, int], tmp_path: Path, figures: Figures,
        stopping: list[Fleet]) -> None:
    kafka, data_dir, port = own_broker
    fleet = Fleet(tmp_path, kafka, baseline=1, powerful=1, ttl_s=6.0)
    stopping.append(fleet)
    fleet.start()
    load = fleet.runner
    warm = fleet.warm_up()
    time.sleep(4)
    epoch_before = fleet.worker_metric("b1", "surplus_worker_targets_epoch")

    down_at = load.now()
    localkafka.down(data_dir)
    time.sleep(OUTAGE_S)
    fleet.assert_alive()
    up_started = load.now()
    localkafka.up(port=port, data_dir=data_dir)
    up_at = load.now()

    def resumed() -> bool:
        fleet.assert_alive()
        recent = [s for s in load.samples if s.t >= up_at]
        return any(s.optional_scored > 0 and s.model == "baseline" for s in recent)

    try:
        recovery_s = fleet.wait_for("optional work resumes after the broker returns", resumed,
                                    90)
    except AssertionError as exc:  # once in a CI rehearsal: say where the targets stopped
        raise AssertionError(f"{exc}; {_where_targets_stopped(fleet, load)}") from None
    resumed_at = load.now()
    epoch_after = fleet.worker_metric("b1", "surplus_worker_targets_epoch")
    time.sleep(5)
    after = load.window(resumed_at)
    b1 = fleet.workers["b1"].metrics()
    summary = load.client_summary()
    fleet.stop()

    before = load.window(warm, down_at)
    expired = load.window(down_at + fleet.ttl_s + 1.0, up_started)
    outage = load.window(down_at, up_at)
    whole = load.window(0.0)
    figures.add("before", figures_of(before))
    figures.add("outage (broker down, then starting)", figures_of(outage))
    figures.add("after targets lapsed", figures_of(expired))
    figures.add("after recovery", figures_of(after))
    figures.add("broker restart s", round(up_at - up_started, 1))
    figures.add("recovery s (broker serving -> optional work again)", round(recovery_s, 1))
    figures.add("epoch before -> after", f"{epoch_before:.0f} -> {epoch_after:.0f}")
    figures.add("client decisions", summary["decisions"])
    figures.add("worker b1 kafka", {
        "outages": b1.get("surplus_worker_kafka_outages_total"),
        "reports_failed_or_dropped": b1.get('surplus_worker_window_reports_total{outcome="failed"}',
                                            0.0)
        + b1.get('surplus_worker_window_reports_total{outcome="dropped"}', 0.0),
        "held_expired": b1.get('surplus_worker_target_verdicts_total{verdict="held_expired"}')})
    figures.add("worker b1 target verdicts",
                by_label(b1, "surplus_worker_target_verdicts_total", "verdict"))

    # Baseline never depends on Kafka: nothing lost, before, during or after.
    assert whole.lost == {} and whole.served == whole.sent, whole.lost
    assert outage.served > 0.9 * load.rate * (up_at - down_at)
    # Targets lapsed at their TTL: no optional work, no powerful routing, all of it counted.
    assert expired.served > 0 and expired.optional_done == 0 and expired.routed_powerful == 0
    assert summary["decisions"]["baseline_only"].get("expired", 0) >= expired.served
    assert b1["surplus_worker_kafka_outages_total"] >= 1
    assert b1['surplus_worker_target_verdicts_total{verdict="held_expired"}'] >= 1
    # Everything resumed, with newer targets than before the outage.
    assert epoch_after > epoch_before
    assert after.optional_done > 0 and after.served_powerful > 0
    assert recovery_s < 60


def _where_targets_stopped(fleet: Fleet, load: object) -> str:
    """What each hop holds of the targets: published by the control plane, applied by the
    worker, held by the client; so a stall after the broker returns names its hop."""
    published = [c.published() for c in fleet.controls]
    worker = {k: v for k, v in fleet.workers["b1"].metrics().items()
              if "targets_epoch" in k or "target_verdicts" in k}
    summary = load.client_summary()  # type: ignore[attr-defined]
    return (f"control plane published {published}; worker b1 {worker}; client effective "
            f"{summary.get('effective')}, feed {summary.get('feed')}")
