"""Small scenarios: the least a scenario file needs, and one whose capacity steps up, steps
down and meets a storm (shared by the scenario, schedule, simulator and live-run tests)."""

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


def lent_scenario(tmp_path: Path, text: str = LENT) -> tuple[Scenario, Path]:
    """``LENT`` (or ``text``) written under ``tmp_path`` and loaded."""
    (tmp_path / "s.toml").write_text(text)
    return load_scenario(tmp_path / "s.toml")
