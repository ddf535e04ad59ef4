"""The control plane is killed with SIGKILL under load and started again under the same
`--instance-id`.

Its state comes back from the changelog: the epoch continues (receivers never see an older or
repeated one), the capacity granted before the crash is still known (it is not re-sent), and
the first targets after the restart are held to the last ones before it, so optional work does
not burst. Baseline traffic never notices.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from schemas.contract import ControlTargets
from schemas.kafka_config import KafkaSettings
from tests.faults.conftest import Figures
from tests.faults.fleet import Fleet, figures_of
from tests.integration.fleet import REGION, by_label
from tests.integration.harness import TopicReader

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]

MAX_STEP = 2.0


def _scope_targets(reader: TopicReader) -> list[ControlTargets]:
    reader.poll(0.5)
    return [t for t in reader.events(ControlTargets) if t.scope == REGION]


def test_control_plane_kill_9_restores_state_and_epoch_without_a_burst(
        kafka: KafkaSettings, tmp_path: Path, figures: Figures, stopping: list[Fleet]) -> None:
    reader = TopicReader(kafka, "targets")
    # A slow ramp (two candidates per period at most) so that a burst could not hide in it.
    # Restarted in place under the same name (static membership): it takes its partitions
    # back at once rather than after the dead member's session times out (10 s > TTL).
    fleet = Fleet(tmp_path, kafka, baseline=1, powerful=1, ttl_s=6.0, extra=48,
                  control_extra=f"[rma]\nmax_step = {MAX_STEP}\n", control_instance="cp-0")
    stopping.append(fleet)
    fleet.start()
    load = fleet.runner
    fleet.warm_up()
    time.sleep(6)  # RMA ramps a while: a restart mid-ramp is where a burst would show

    killed_at = load.now()
    fleet.controls[0].kill()
    before = _scope_targets(reader)
    last = before[-1]
    restarted = fleet.control_plane("cp-restarted", args=["--instance-id", "cp-0"])
    recovery_s = fleet.wait_for(
        "the restarted control plane's targets reach the worker",
        lambda: fleet.worker_metric("b1", "surplus_worker_targets_epoch") > last.epoch, 90)
    resumed_at = load.now()
    time.sleep(6)
    fleet.assert_alive(fleet.controls[0])
    assert restarted.alive()
    b1 = fleet.workers["b1"].metrics()
    after = _scope_targets(reader)[len(before):]
    reader.close()
    fleet.stop()

    pre = load.window(killed_at - 4.0, killed_at)
    gap = load.window(killed_at, resumed_at)
    first3 = load.window(resumed_at, resumed_at + 3.0)
    whole = load.window(0.0)
    verdicts = by_label(b1, "surplus_worker_target_verdicts_total", "verdict")
    first = after[0]
    figures.add("before kill (4 s)", figures_of(pre))
    figures.add("kill -> new targets applied", figures_of(gap))
    figures.add("first 3 s after", figures_of(first3))
    figures.add("recovery s (kill -> restarted targets on the worker)", round(recovery_s, 1))
    figures.add("epoch / extra / coverage / budget before -> first after", {
        "epoch": [last.epoch, first.epoch], "reason": first.reason,
        "extra": [last.rma.extra_candidates, first.rma.extra_candidates],
        "coverage": [last.sbm.coverage, first.sbm.coverage],
        "budget": [round(last.rma.budget_units_per_s), round(first.rma.budget_units_per_s)]})
    figures.add("worker b1 target verdicts", verdicts)

    epochs = [t.epoch for t in before + after]
    assert all(b > a for a, b in itertools.pairwise(epochs)), epochs
    assert verdicts.get("older_epoch", 0) == 0 and verdicts.get("duplicate_epoch", 0) == 0
    # State restored: the epoch continues and the capacity granted before the crash is known.
    assert first.epoch > last.epoch and first.reason == "restart"
    assert first.rma.budget_units_per_s > 0
    # No burst: the first targets are held to the last ones, and so is the work they allow.
    assert first.rma.extra_candidates <= last.rma.extra_candidates
    assert first.sbm.coverage <= last.sbm.coverage
    rma = [s.optional_scored for s in load.samples
           if resumed_at <= s.t < resumed_at + 3.0 and s.served and s.model == "baseline"]
    per_request = sum(rma) / max(len(rma), 1)
    figures.add("RMA extra per request, first 3 s after", round(per_request, 1))
    assert per_request <= last.rma.extra_candidates + 3 * MAX_STEP, per_request
    assert whole.lost == {} and whole.served == whole.sent
    assert first3.optional_done > 0
    # Static membership: back in the time a process takes to start, not after the dead
    # member's 10 s session (which took 9.3 s here before the restart kept its name).
    assert recovery_s < 8.0, recovery_s
