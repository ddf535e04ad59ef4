"""What a simulation measured: ground truth kept by the plant, not what telemetry reported.

The SLA is judged on windows of ``sla_window_s`` (default: the control period) per region, on
every request that finished in the window whichever path served it, as the live demo judges
it: the p99 of the server-side latency of the requests the ranking pools served (fallbacks
included; what the ranking SLA is about) against ``sla_p99_ms``, and the p99 of the latency
of the requests the powerful replicas served (those the client gave up on included) against
the region's deadline. A window is violated when either is over its bound; a window with no
request is not judged. ``timeline.csv`` has one row per region and window.

A powerful call the client has given up on (past its share of the deadline, see
``sim.requests``) is a fallback, not a powerful answer: it earns no SBM value, and
``powerful_abandoned`` counts such calls.

Other headline numbers: ``baseline_requests_rejected`` counts ranking requests answered slower
than the region's ``timeout_ms`` (the caller gave up; workers themselves never refuse baseline
work); ``opportunistic_utilization`` is accelerator-seconds of work served on opportunistic
replicas over accelerator-seconds they were lent (draining ones included);
``incremental_value`` sums the true gains of the optional work actually done (RMA: a concave
value of the extra candidates scored; SBM: the segment's gain from the powerful model);
``limited_by`` counts, per lever, the control periods by what kept the target from going higher
(the timeline's last two columns give the latest per window); ``max_notice_to_shed_ms`` is,
over every worker a preemption notice concerned, the time from the notice's timestamp to the
moment that worker had stopped optional work: the notice's (modelled) delivery delay when
workers act on delivery, as they must.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from schemas.contract import ControlTargets
from streams.replay_output import csv_line

TIMELINE_COLUMNS = (
    "t_s", "region", "requests", "ranking_p99_ms", "violation", "e2e_p99_ms",
    "extra_candidates_target", "coverage_target", "powerful_share", "opportunistic_replicas",
    "optional_units_done", "optional_units_shed", "incremental_value", "rejected",
    "rma_limited_by", "sbm_limited_by")


def read_timeline(path: Path) -> list[dict[str, str]]:
    """A run's ``timeline.csv``, a dict of strings per row (the report's plots and the oracle
    read it back)."""
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


class LimitTally:
    """Control periods per lever by what limited the lever's target (``limited_by``). Only
    period targets count: fast-path and restart targets say preemption and hold by
    construction. The simulator and the demo's report both count with it."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {"rma": {}, "sbm": {}}

    def add(self, targets: ControlTargets) -> None:
        if targets.reason != "period":
            return
        for lever, why in targets.limits:
            if why is not None:
                counts = self.counts.setdefault(lever, {})
                counts[why] = counts.get(why, 0) + 1

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {lever: dict(sorted(c.items())) for lever, c in self.counts.items()}


@dataclass
class Window:
    """One region's accumulators for the current SLA window."""

    ranking: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    powerful_latency: list[float] = field(default_factory=list)
    """Latencies of the requests the powerful replicas served (given up on or not)."""
    requests: int = 0
    powerful: int = 0
    optional_done: int = 0
    value: float = 0.0
    rejected: int = 0


@dataclass
class RegionMetrics:
    name: str
    sla_p99_ms: float
    deadline_ms: float = math.inf
    window: Window = field(default_factory=Window)
    windows: int = 0
    violations: int = 0
    worst_p99: float = 0.0
    worst_powerful_p99: float = 0.0
    requests: int = 0
    ranking_served: int = 0
    powerful_served: int = 0
    fallbacks: int = 0
    abandoned: int = 0
    moved: int = 0
    rejected: int = 0
    rma_value: float = 0.0
    sbm_value: float = 0.0
    precompute_value: float = 0.0
    optional_done: int = 0
    e2e: list[float] = field(default_factory=list)
    shed_seen: int = 0


def p99(values: list[float]) -> float:
    """The exact 99th percentile of a window's latencies (0 for none): the simulator holds
    every latency, so its verdicts carry no sketch error for the live ones to be judged by."""
    return float(np.quantile(np.asarray(values), 0.99)) if values else 0.0


class Metrics:
    """Accumulates a run's ground truth and writes the timeline."""

    def __init__(self, regions: dict[str, float], timeline: IO[str], start_ms: int, *,
                 deadlines: dict[str, float] | None = None, precompute: bool = False) -> None:
        deadlines = deadlines or {}
        #: The precompute lever runs (its value is then reported beside RMA's and SBM's).
        self.precompute = precompute
        self.regions = {name: RegionMetrics(name, sla, deadlines.get(name, math.inf))
                        for name, sla in sorted(regions.items())}
        self.timeline = timeline
        self.start_ms = start_ms
        timeline.write(csv_line(TIMELINE_COLUMNS))
        self.opportunistic_available_s = 0.0
        self.opportunistic_used_s = 0.0
        self.notice_to_shed_ms: list[float] = []
        self.first_notice_ms: int | None = None
        self.optional_done_before_notice = 0
        self.notices = 0
        self.limited_by = LimitTally()
        self.last_limits: dict[str, tuple[str | None, str | None]] = {}

    def ranking_done(self, region: str, latency_ms: float, e2e_ms: float, timeout_ms: float,
                     optional_done: int, rma_value: float) -> None:
        """A ranking answer. Past ``timeout_ms`` the caller had given up: it counts as a
        rejected baseline request, and its optional work as worth nothing, however much was
        done."""
        m = self.regions[region]
        w = m.window
        m.requests += 1
        m.ranking_served += 1
        w.requests += 1
        w.ranking.append(latency_ms)
        w.e2e.append(e2e_ms)
        m.e2e.append(e2e_ms)
        if latency_ms > timeout_ms:
            m.rejected += 1
            w.rejected += 1
            return
        self._optional(m, optional_done, rma_value)
        m.rma_value += rma_value

    def powerful_done(self, region: str, e2e_ms: float, units: int, value: float,
                      rma_value: float) -> None:
        """A powerful answer the client used; its latency is judged in
        :meth:`powerful_answered`, which also sees the answers the client had given up on."""
        m = self.regions[region]
        w = m.window
        m.requests += 1
        m.powerful_served += 1
        w.requests += 1
        w.powerful += 1
        w.e2e.append(e2e_ms)
        m.e2e.append(e2e_ms)
        self._optional(m, units, value + rma_value)
        m.sbm_value += value
        m.rma_value += rma_value

    def precompute_used(self, region: str, value: float) -> None:
        """A request served from a precompute answer, worth ``value`` over its own optional
        work (`sim.precompute`)."""
        m = self.regions[region]
        m.precompute_value += value
        m.window.value += value

    def powerful_answered(self, region: str, latency_ms: float, *, abandoned: bool) -> None:
        """A powerful replica's answer, judged against the deadline whether or not the client
        was still waiting for it (``abandoned``: it had given up and fallen back)."""
        m = self.regions[region]
        m.window.powerful_latency.append(latency_ms)
        m.abandoned += abandoned

    def _optional(self, m: RegionMetrics, units: int, value: float) -> None:
        m.optional_done += units
        m.window.optional_done += units
        m.window.value += value
        if self.first_notice_ms is None:
            self.optional_done_before_notice += units

    def notice_applied(self, notice_ts_ms: int, applied_ms: float) -> None:
        """A replica stopped optional work on a notice: from the notice's stamp, as the live
        notice-to-shed figure is measured."""
        self.notice_to_shed_ms.append(applied_ms - notice_ts_ms)

    def notice_issued(self, ts_ms: int) -> None:
        """A notice left the platform; the first one ends the optional work counted as done
        before any reclaim."""
        self.notices += 1
        if self.first_notice_ms is None:
            self.first_notice_ms = ts_ms

    def targets_emitted(self, targets: ControlTargets) -> None:
        """What limited each lever: tallied per period, and the latest for the timeline (a
        controller that does not say, like the fixed ones, leaves both empty)."""
        self.last_limits[targets.scope] = (targets.rma.limited_by, targets.sbm.limited_by)
        self.limited_by.add(targets)

    def close_window(self, end_ms: int, region: str, *, extra_target: int, coverage: float,
                     opportunistic_replicas: int, shed_total: int) -> None:
        """The SLA verdict of one window and its timeline row. A window is judged on every
        baseline request whichever path served it (ranking answers against the SLA, powerful
        ones against the deadline), and is not counted at all when it saw neither."""
        m = self.regions[region]
        w = m.window
        ranking_p99 = p99(w.ranking)
        powerful_p99 = p99(w.powerful_latency)
        violation = (bool(w.ranking) and ranking_p99 > m.sla_p99_ms) or (
            bool(w.powerful_latency) and powerful_p99 > m.deadline_ms)
        if w.ranking or w.powerful_latency:
            m.windows += 1
            m.violations += violation
            m.worst_p99 = max(m.worst_p99, ranking_p99)
            m.worst_powerful_p99 = max(m.worst_powerful_p99, powerful_p99)
        shed = shed_total - m.shed_seen
        m.shed_seen = shed_total
        self.timeline.write(csv_line((
            (end_ms - self.start_ms) / 1000.0, region, w.requests, ranking_p99, violation,
            p99(w.e2e), extra_target, coverage, w.powerful / w.requests if w.requests else 0.0,
            opportunistic_replicas, w.optional_done, shed, round(w.value, 6), w.rejected,
            *(why or "" for why in self.last_limits.get(region, (None, None))))))
        m.window = Window()

    def summary(self) -> dict[str, Any]:
        """The run's ground truth over every region (what ``summary.json`` holds); what
        the controllers believed is not in it, so a comparison judges them all alike."""
        regions = self.regions.values()
        e2e = [x for m in regions for x in m.e2e]
        return {
            "windows": sum(m.windows for m in regions),
            "baseline_sla_violation_windows": sum(m.violations for m in regions),
            "baseline_requests_rejected": sum(m.rejected for m in regions),
            "opportunistic_utilization": _ratio(self.opportunistic_used_s,
                                                self.opportunistic_available_s),
            "opportunistic_accelerator_s": {
                "available": round(self.opportunistic_available_s, 3),
                "used": round(self.opportunistic_used_s, 3)},
            "incremental_value": round(sum(m.rma_value + m.sbm_value + m.precompute_value
                                           for m in regions), 6),
            "incremental_value_by_lever": {
                "rma": round(sum(m.rma_value for m in regions), 6),
                "sbm": round(sum(m.sbm_value for m in regions), 6),
                **({"precompute": round(sum(m.precompute_value for m in regions), 6)}
                   if self.precompute else {})},
            "max_notice_to_shed_ms": round(max(self.notice_to_shed_ms), 3)
            if self.notice_to_shed_ms else None,
            "preemption_notices": self.notices,
            "first_notice_s": None if self.first_notice_ms is None
            else (self.first_notice_ms - self.start_ms) / 1000.0,
            "optional_units_done_before_first_notice": self.optional_done_before_notice,
            "optional_units_done": sum(m.optional_done for m in regions),
            "requests": sum(m.requests for m in regions),
            "e2e_p99_ms": round(p99(e2e), 3),
            "limited_by": self.limited_by.as_dict(),
            "regions": {m.name: {
                "requests": m.requests, "ranking_served": m.ranking_served,
                "powerful_served": m.powerful_served, "sbm_fallbacks": m.fallbacks,
                "powerful_abandoned": m.abandoned,
                "moved_at_preemption": m.moved, "windows": m.windows,
                "sla_p99_ms": m.sla_p99_ms,
                "baseline_sla_violation_windows": m.violations,
                "worst_window_p99_ms": round(m.worst_p99, 3),
                "deadline_ms": m.deadline_ms,
                "worst_window_powerful_p99_ms": round(m.worst_powerful_p99, 3),
                "baseline_requests_rejected": m.rejected,
                "rma_value": round(m.rma_value, 6), "sbm_value": round(m.sbm_value, 6),
                "optional_units_done": m.optional_done} for m in regions},
        }


def _ratio(used: float, available: float) -> float:
    return round(used / available, 6) if available > 0 and math.isfinite(used) else 0.0
