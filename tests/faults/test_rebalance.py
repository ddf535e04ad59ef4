"""A second control-plane process joins the consumer group under load, then leaves.

Scopes (eu1 with a worker fleet, us2 with capacity only) move to the newcomer and back. Each
scope keeps exactly one owner: its epochs only grow on the targets topic, receivers never see a
repeated or older epoch, the longest gap between two targets stays inside the TTL, so optional
work never stops and baseline never notices.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from schemas.clock import wall_ms
from schemas.codec import decode
from schemas.contract import ControlTargets
from schemas.kafka_config import KafkaSettings
from tests.faults.conftest import Figures
from tests.faults.fleet import Fleet, figures_of
from tests.integration.fleet import REGION, by_label, grant
from tests.integration.harness import TopicReader

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]

OTHER = "us2"  # hashes to the other partition of 2 (murmur2)


def _gaps_ms(published: list[tuple[int, ControlTargets]], scope: str,
             since_ms: int) -> list[int]:
    times = sorted(ts for ts, t in published if t.scope == scope and ts >= since_ms)
    return [b - a for a, b in itertools.pairwise(times)]


def test_control_plane_joins_and_leaves_under_load_one_owner_per_scope(
        kafka: KafkaSettings, tmp_path: Path, figures: Figures, stopping: list[Fleet]) -> None:
    reader = TopicReader(kafka, "targets")
    fleet = Fleet(tmp_path, kafka, baseline=1, powerful=0, ttl_s=6.0)
    stopping.append(fleet)
    fleet.start()
    grant(kafka, f"{OTHER}/rank/baseline/a100/opportunistic", region=OTHER)
    load = fleet.runner
    first = fleet.controls[0]
    fleet.wait_for("both scopes have targets", lambda: set(first.published()) >= {REGION, OTHER},
                   60)
    warm = fleet.warm_up()
    settled_ms = wall_ms()
    time.sleep(3)

    join_at = load.now()
    second = fleet.control_plane("cp-joiner")
    join_s = fleet.wait_for("the joiner owns a scope", lambda: bool(second.published()), 90,
                            poll_s=0.25)
    owned = sorted(second.published())
    time.sleep(6)
    fleet.assert_alive()
    before_leave = {s: first.published().get(s, 0.0) for s in owned}
    leave_at = load.now()
    assert second.stop() == 0, second.output()[-3000:]
    fleet.wait_for("the first process takes its scopes back",
                   lambda: all(first.published().get(s, 0.0) > before_leave[s] for s in owned),
                   60, poll_s=0.25)
    leave_s = load.now() - leave_at
    time.sleep(4)
    fleet.assert_alive(second)
    b1 = fleet.workers["b1"].metrics()
    reader.poll(0.5)
    fleet.stop()

    published = [(m.timestamp()[1], decode(ControlTargets, m.value())) for m in reader.messages]
    reader.close()
    verdicts = by_label(b1, "surplus_worker_target_verdicts_total", "verdict")
    per_second = [load.window(t, t + 1.0).optional_done
                  for t in range(int(warm) + 1, int(load.window(0).t1) - 1)]
    gaps = {s: max(_gaps_ms(published, s, settled_ms)) for s in (REGION, OTHER)}
    figures.add("joiner took scopes", owned)
    figures.add("join: start -> first targets from the joiner s", round(join_s, 1))
    figures.add("leave: SIGTERM -> scopes published by the remaining process s",
                round(leave_s, 1))
    figures.add("longest gap between targets per scope ms (TTL 6000)", gaps)
    figures.add("during join", figures_of(load.window(join_at, leave_at)))
    figures.add("during leave", figures_of(load.window(leave_at, leave_at + leave_s + 4)))
    figures.add("RMA extras per second, lowest second", min(per_second))
    figures.add("worker b1 target verdicts", verdicts)

    for scope in (REGION, OTHER):
        epochs = [t.epoch for _, t in published if t.scope == scope]
        assert all(b > a for a, b in itertools.pairwise(epochs)), (scope, epochs)
    assert verdicts.get("older_epoch", 0) == 0 and verdicts.get("duplicate_epoch", 0) == 0
    assert verdicts.get("held_expired", 0) == 0, verdicts  # never fell back to baseline only
    assert max(gaps.values()) < fleet.ttl_s * 1000, gaps
    assert min(per_second) > 0, per_second
    whole = load.window(warm)
    assert whole.lost == {} and whole.served == whole.sent
