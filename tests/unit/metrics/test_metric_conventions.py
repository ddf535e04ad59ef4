"""Every process's /metrics passes `promtool check metrics` (base units, no abbreviations,
counters ending in _total) and carries process and build-info series, so dashboards and alert
rules can rely on the conventions Prometheus users expect."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from schemas.build import surplus_version
from streams.agents.metrics import Metrics
from surplus.live.loadgen import LoadMetrics
from surplus.live.scheduler import SchedulerMetrics
from tests.unit.metrics.promtool import promtool
from workers.policy.admission import AdmissionState
from workers.policy.targets import NO_TARGETS
from workers.runtime.metrics import Snapshot, WorkerMetrics


def _worker() -> CollectorRegistry:
    admission = AdmissionState(queue_delay_ms=1.5, shedding_level=0, preempted=False,
                               baseline_items=1, baseline_units=1, optional_items=0,
                               optional_units=0, in_flight_units=0, ms_per_unit=0.1,
                               batch_overhead_ms=0.5, shed_units={"overload": 2})
    snapshot = Snapshot(admission=admission, targets=NO_TARGETS, target_verdicts={"ok": 1},
                        in_flight=1, targets_age_ms=1500)
    return WorkerMetrics(lambda: snapshot).registry


REGISTRIES = {
    "worker": _worker,
    "control-plane": lambda: Metrics().registry,
    "loadgen": lambda: LoadMetrics().registry,
    "scheduler": lambda: SchedulerMetrics().registry,
}


@pytest.mark.parametrize("process", sorted(REGISTRIES))
def test_metrics_pass_promtool_check_metrics(process: str) -> None:
    text = generate_latest(REGISTRIES[process]())
    done = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True,
                          timeout=60)
    problems = (done.stdout + done.stderr).decode().strip()
    assert done.returncode == 0 and not problems, f"{process} /metrics: {problems}"


@pytest.mark.parametrize("process", ["worker", "control-plane"])
def test_long_running_processes_expose_process_and_build_info_series(process: str) -> None:
    registry = REGISTRIES[process]()
    assert registry.get_sample_value("process_resident_memory_bytes") is not None
    assert registry.get_sample_value("process_open_fds") is not None
    build = [s for m in registry.collect() if m.name == "surplus_build" for s in m.samples]
    assert [s.labels["version"] for s in build] == [surplus_version()]


def test_the_worker_reports_queue_delay_and_budget_in_base_units() -> None:
    registry = _worker()
    assert registry.get_sample_value("surplus_worker_queue_delay_seconds") == 0.0015
    assert registry.get_sample_value("surplus_worker_targets_budget_units_per_second") == 0.0
    assert registry.get_sample_value("surplus_worker_queue_delay_ms") is None


DASHBOARD = Path(__file__).resolve().parents[3] / "infra/helm/surplus/dashboards/surplus.json"
_SERIES = re.compile(r"\bsurplus_[a-z0-9_]+")
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _exposed_families() -> set[str]:
    return {family.name for build in REGISTRIES.values() for family in build().collect()}


def test_every_dashboard_query_reads_a_series_some_process_exposes() -> None:
    """A renamed metric would otherwise leave its panel silently empty."""
    exposed = _exposed_families()
    panels = json.loads(DASHBOARD.read_text())["panels"]
    missing = set()
    for panel in panels:
        for target in panel.get("targets", []):
            for name in _SERIES.findall(target["expr"]):
                base = next((name[:-len(s)] for s in _SUFFIXES if name.endswith(s)), name)
                if name not in exposed and base not in exposed:
                    missing.add(f"{panel['title']}: {name}")
    assert not missing, sorted(missing)
