"""A short chaos run: the fleet under a fixed seed's random schedule of faults, checked over its
whole history (`surplus chaos`, docs/reliability.md).

The seed is fixed so the run replays; its schedule holds faults of most kinds, several at once
(a broker down while the control plane restarts, a storm of notices while a worker is frozen).
The run fails, never skips, when it cannot run: no Java, no Kafka jars, no toxiproxy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from surplus.chaos.config import ChaosConfig
from surplus.chaos.run import Chaos, Options, report
from surplus.chaos.schedule import ScheduleConfig, draw
from tests.faults.conftest import Figures

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]

SEED = 7
DURATION_S = 150.0
#: Faults close together, so that they overlap in a short run.
CONFIG = ChaosConfig(schedule=ScheduleConfig(mean_gap_s=5.0, warmup_s=5.0, cooldown_s=25.0))


def test_the_schedule_of_the_short_run_overlaps_faults_of_many_kinds() -> None:
    faults = draw(SEED, DURATION_S, CONFIG.schedule)
    assert len({f.kind for f in faults}) >= 6, faults
    assert any(b.at_s < a.end_s for i, a in enumerate(faults) for b in faults[i + 1:])


def test_chaos_run_breaks_no_invariant(tmp_path: Path, figures: Figures) -> None:
    result = Chaos(Options(seed=SEED, duration_s=DURATION_S, out=tmp_path / "chaos",
                           config=CONFIG), say=print).run()
    lines: list[str] = []
    report(result, lines.append)
    s = result.summary
    figures.add("faults injected by kind", s["faults"])
    figures.add("faults not injected", s["faults_not_injected"])
    figures.add("requests / served / by the powerful model", [s["requests"], s["served"],
                                                              s["served_powerful"]])
    figures.add("violations", s["violations"])
    assert not s["crashed"], s["crashed"]
    assert not result.violations, "\n".join(lines)
    # The run did what it set out to: faults of most kinds went in, optional work was done.
    assert len(s["faults"]) >= 5, s["faults"]
    assert s["served_powerful"] > 0 and s["optional_scored"] > 0
    assert s["served"] == s["requests"] > 0
