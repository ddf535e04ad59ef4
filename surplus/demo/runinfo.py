"""The files a demo run writes beside its processes' own output: the workers' config
(`worker_tree`), ``run.json`` (`run_info`), the closing verdict line (`verdict`) and the
Prometheus scrape config (`prometheus_config`). Pure: each builds its value from what it is
given, and the run writes it."""

from __future__ import annotations

from typing import Any

import msgspec

from sim.scenario import Scenario
from surplus.demo.analysis import RunInfo
from surplus.live import plan


def worker_tree(scenario: Scenario, replicas: list[plan.Replica]) -> dict[str, Any]:
    """Every worker's config (``worker.toml``): an equal share of the RMA budget per ranking
    replica, a model warmed up on the most candidates a request can carry, the scenario's
    admission, limits and precompute pacing (the lever is turned on per replica, by flag)."""
    region = scenario.regions[0]
    ranking = sum(1 for r in replicas if r.model == "baseline")
    return {"budget_share": round(1.0 / max(1, ranking), 6),
            "model": {"threads": 1, "warmup_rows": region.base_candidates
                      + region.max_extra_candidates,
                      **({"config": dict(scenario.worker.model)}
                         if scenario.worker.model else {})},
            "batching": {"max_wait_ms": 1.0},
            "admission": _builtins(scenario.worker.admission),
            "limits": _builtins(scenario.worker.limits),
            "precompute": {k: v for k, v in _builtins(scenario.worker.precompute).items()
                           if k != "enabled"}}


def _builtins(struct: Any) -> dict[str, Any]:
    value = msgspec.to_builtins(struct)
    assert isinstance(value, dict)
    return value


def run_info(scenario: Scenario, phases: list[plan.Phase], replicas: list[plan.Replica],
             start_ms: int, end_ms: int, duration_s: float, *, interrupted: bool,
             kafka: str, endpoints: dict[str, int],
             replica_changes: list[tuple[float, str, str]] | None = None,
             slices: dict[str, Any] | None = None) -> RunInfo:
    """What ``run.json`` holds of a run, for the report built later from disk alone: the
    scenario's settings that judge it, its phases and storms, its replicas and their changes
    (seconds into the run, worker, ``started``/``reclaimed``), the endpoints scraped and the
    CPU slices (``ReplicaBook.slices_info``)."""
    region = scenario.regions[0]
    return RunInfo(
        scenario=scenario.name, region=region.name, start_ms=start_ms, end_ms=end_ms,
        duration_s=duration_s, period_ms=scenario.control.period_ms,
        min_samples=scenario.control.min_samples, sla_p99_ms=scenario.control.rma.sla_p99_ms,
        sbm_sla_p99_ms=scenario.control.sbm.sla_p99_ms, base_candidates=region.base_candidates,
        phases=[(p.name, p.start_s, p.end_s) for p in phases],
        storms=plan.storm_windows(scenario), replicas=[r.worker_id for r in replicas],
        interrupted=interrupted, kafka=kafka,
        endpoints=endpoints, replica_changes=replica_changes or [],
        deadline_ms=region.deadline_ms, slices=slices or {})


def verdict(summary: dict[str, Any]) -> str:
    """The one line a run ends on, from its ``summary.json``: baseline served and within its
    SLA, the opportunistic share used, optional work done and shed, its value, and how fast
    a notice stopped optional work."""
    return (f"summary: {summary.get('baseline_requests_total', 0)} baseline requests, "
            f"{summary.get('baseline_requests_failed')} failed, "
            f"{summary.get('baseline_sla_violation_windows')} SLA-violation windows "
            f"({summary.get('baseline_windows_judged')} of "
            f"{summary.get('baseline_windows_total')} judged); opportunistic busy share "
            f"{summary.get('opportunistic_busy_share_lent')} "
            f"({(summary.get('cpu_slices') or {}).get('mode', 'none')} slices); "
            f"optional units done "
            f"{summary.get('optional_units_done', 0):,}, shed "
            f"{summary.get('optional_units_shed', 0):,}; incremental value "
            f"{summary.get('incremental_value')}; notice->shed p99 "
            f"{summary.get('notice_to_shed_p99_ms')} ms")


def prometheus_config(targets: dict[str, list[int]], pools: dict[int, str] | None = None) -> str:
    """A scrape config for the run's endpoints (job per kind of process). A worker's target
    carries its ``pool`` label, as compose's scrape config and the chart's ServiceMonitor set
    it: the dashboard tells opportunistic pools by it."""
    pools = pools or {}
    lines = ["global:", "  scrape_interval: 2s", "scrape_configs:"]
    for job, ports in targets.items():
        lines += [f"  - job_name: {job}", "    static_configs:"]
        plain = [p for p in ports if p not in pools]
        if plain:
            hosts = ", ".join(f"'127.0.0.1:{p}'" for p in plain)
            lines.append(f"      - targets: [{hosts}]")
        for port in (p for p in ports if p in pools):
            lines += [f"      - targets: ['127.0.0.1:{port}']",
                      f"        labels: {{pool: '{pools[port]}'}}"]
    return "\n".join(lines) + "\n"
