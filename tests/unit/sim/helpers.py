"""Small scenarios: the least a scenario file needs, one whose capacity steps up, steps down
and meets a storm, and one whose requests all go to a powerful replica (shared by the
scenario, schedule, simulator and live-run tests)."""

from __future__ import annotations

from pathlib import Path

from sim.scenario import Scenario, load_scenario

MINIMAL = """
name = "tiny"
duration_s = 10.0
[[regions]]
name = "eu1"
[[regions.segments]]
name = "all"
share = 1.0
[[regions.pools]]
replicas = 1
"""

LENT = MINIMAL.replace("duration_s = 10.0", "duration_s = 60.0") + """
[[regions.pools]]
tier = "opportunistic"
accelerator = "cpu"
grant_every_s = 4.0
grant_ttl_s = 10.0
cpu_per_replica = 4.0
[regions.pools.capacity]
kind = "steps"
steps = [[5.0, 3], [30.0, 1]]
notice_s = 2.0
[[storms]]
at_s = 40.0
notice_s = 1.0
return_after_s = 10.0
[control]
period_s = 2.0
"""

#: Every request goes to a powerful replica whose latency is ``ms`` (``.format(ms=...)``); the
#: client waits 60 ms for it (its default share of the 100 ms deadline).
POWERFUL = MINIMAL.replace("duration_s = 10.0", "duration_s = 20.0") + """
[[regions.pools]]
model = "powerful"
tier = "opportunistic"
accelerator = "a100"
latency_sigma = 0.0
latency_curve = [[0.0, {ms}], [1.0, {ms}]]
[regions.pools.capacity]
replicas = 1
[control]
period_s = 2.0
[control.sbm]
sla_p99_ms = 55.0
[controllers.static]
coverage = 1.0
"""


def lent_scenario(tmp_path: Path, text: str = LENT) -> tuple[Scenario, Path]:
    """``LENT`` (or ``text``) written under ``tmp_path`` and loaded."""
    (tmp_path / "s.toml").write_text(text)
    return load_scenario(tmp_path / "s.toml")
