"""What a run did, computed from what it recorded: the event log, the load generator's files and
the workers' preemption-reaction histograms. No clock, no Kafka: the same files give the same
numbers, so a report can be rebuilt from a run directory at any time (``surplus demo --report``).

Definitions (the ones ``summary.json`` states):

- *baseline SLA window*: a control period (``period_s``) of the load phase in which some ranking
  pool (model ``baseline``, either tier) reported at least ``min_samples`` latencies; it is a
  *violation* when that pool's merged p99 exceeds ``rma.sla_p99_ms``. This is the measure the
  control plane acts on, judged on the same grid.
- *optional unit*: one candidate row scored beyond the request's baseline work — an RMA extra
  candidate, or any row of a request served by the powerful model. Done and worker-side shed
  units come from the workers' WindowReports; client-side cuts (extra candidates the client did
  not send because of its budget or overload allowance, and requests kept off the powerful
  model by overload, counted at ``base_candidates`` rows each) from the client's counters.
- *incremental value*: the scenario's true (noise-free) gain of the optional work actually done.
- *notice to shed*: PreemptionNotice ``ts_ms`` to optional work stopped on the worker, from each
  worker's ``surplus_worker_preemption_reaction_seconds`` histogram, p99 interpolated within
  its bucket the way Prometheus' ``histogram_quantile`` does.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from schemas.contract import ControlTargets, LatencySketch
from schemas.sketch import SketchMerger
from sim.metrics import LimitTally
from streams.control.inventory import PoolInventory
from streams.eventlog import (
    CapacityLogEvent,
    PreemptionEvent,
    TargetsEvent,
    TelemetryEvent,
    read_events,
)

Series = tuple[list[float], list[float]]


@dataclass(frozen=True)
class RunInfo:
    """What the orchestrator knows about a run (``run.json``)."""

    scenario: str
    region: str
    start_ms: int
    end_ms: int
    duration_s: float
    period_ms: int
    min_samples: int
    sla_p99_ms: float
    sbm_sla_p99_ms: float
    base_candidates: int
    phases: list[tuple[str, float, float]]
    storms: list[tuple[float, float]]
    replicas: list[str]
    interrupted: bool = False
    kafka: str = ""
    endpoints: dict[str, int] = field(default_factory=dict)
    """Local ports the run's processes served on (process name -> port)."""
    replica_changes: list[tuple[float, str, str]] = field(default_factory=list)
    """Opportunistic replicas started / reclaimed: (seconds into the run, worker, change)."""

    @classmethod
    def read(cls, path: Path) -> RunInfo:
        raw = json.loads(path.read_text())
        raw["phases"] = [tuple(p) for p in raw["phases"]]
        raw["storms"] = [tuple(s) for s in raw["storms"]]
        raw["replica_changes"] = [tuple(c) for c in raw.get("replica_changes", [])]
        known = {f.name for f in fields(cls)}  # a run.json from an older release: drop extras
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass
class Telemetry:
    """Worker reports bucketed by control window and by second."""

    windows: dict[int, dict[str, SketchMerger]] = field(default_factory=dict)
    powerful: dict[int, SketchMerger] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    shed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rejected: int = 0
    per_second: dict[int, dict[str, float]] = field(default_factory=dict)
    reports: int = 0


@dataclass
class Recorded:
    """Everything read from the event log."""

    telemetry: Telemetry
    targets: list[ControlTargets]
    capacity: list[tuple[int, str, Any]]
    notices: list[int]
    events: dict[str, int]
    bad_lines: int


def read_log(path: Path, info: RunInfo) -> Recorded:
    tel = Telemetry()
    targets: list[ControlTargets] = []
    capacity: list[tuple[int, str, Any]] = []
    notices: list[int] = []
    counts: dict[str, int] = defaultdict(int)
    reader = read_events(path)
    for event in reader:
        counts[event.topic] += 1
        if isinstance(event, TelemetryEvent):
            _telemetry(tel, event.value, info)
        elif isinstance(event, TargetsEvent):
            targets.append(event.value)
        elif isinstance(event, CapacityLogEvent):
            capacity.append((event.value.ts_ms, "capacity", event.value))
        elif isinstance(event, PreemptionEvent):
            capacity.append((event.value.ts_ms, "preemption", event.value))
            notices.append(event.value.ts_ms)
    stats = reader.stats()
    return Recorded(tel, sorted(targets, key=lambda t: (t.issued_at_ms, t.epoch)),
                    sorted(capacity, key=lambda c: c[0]), sorted(notices), dict(counts),
                    int(stats.get("bad_lines", 0)))


def _telemetry(tel: Telemetry, report: Any, info: RunInfo) -> None:
    tel.reports += 1
    lever = "rma" if report.model == "baseline" else "sbm"
    tel.done[lever] += report.optional_units_done
    for reason, n in report.optional_units_shed.items():
        tel.shed[reason] += n
    tel.rejected += report.baseline_rejected
    end = report.window_end_ms
    second = (end - info.start_ms) // 1000
    row = tel.per_second.setdefault(second, defaultdict(float))
    row["done"] += report.optional_units_done
    if report.model == "baseline":
        row["done_rma"] += report.optional_units_done
    else:
        row["powerful_requests"] += report.requests - report.baseline_requests
    for reason, n in report.optional_units_shed.items():
        row[f"shed/{reason}"] += n
    if report.tier == "opportunistic":
        row["used_units"] += report.utilisation
        if report.units_done:
            span_s = max(report.window_end_ms - report.window_start_ms, 1) / 1000.0
            row["optional_units_busy"] += (report.busy_s / span_s * report.optional_units_done
                                           / report.units_done)
    if not info.start_ms < end <= info.end_ms:
        return
    window = (end - info.start_ms - 1) // info.period_ms
    sketch: LatencySketch = report.latency_ms
    if report.model == "baseline":
        pools = tel.windows.setdefault(window, {})
        pools.setdefault(report.pool_id, SketchMerger(sketch.relative_accuracy)).add(sketch)
    else:
        tel.powerful.setdefault(window, SketchMerger(sketch.relative_accuracy)).add(sketch)


# -- latency windows ------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    index: int
    start_s: float
    p99_ms: float | None
    samples: int
    judged: bool
    violated: bool


def ranking_windows(tel: Telemetry, info: RunInfo) -> list[Window]:
    """Each control window's worst ranking pool (among pools with enough samples)."""
    out = []
    n = math.ceil((info.end_ms - info.start_ms) / info.period_ms)
    for k in range(n):
        pools = tel.windows.get(k, {})
        judged = [(m.quantile(0.99), m.count) for m in pools.values()
                  if m.count >= info.min_samples]
        samples = sum(m.count for m in pools.values())
        worst = max((p for p, _ in judged), default=None)
        out.append(Window(k, k * info.period_ms / 1000.0, worst, samples, bool(judged),
                          worst is not None and worst > info.sla_p99_ms))
    return out


def powerful_p99(tel: Telemetry, info: RunInfo) -> Series:
    xs, ys = [], []
    for k in sorted(tel.powerful):
        merger = tel.powerful[k]
        if merger.count:
            xs.append(k * info.period_ms / 1000.0)
            ys.append(merger.quantile(0.99))
    return xs, ys


# -- targets and capacity ----------------------------------------------------------------------

def targets_series(targets: list[ControlTargets], info: RunInfo) -> dict[str, Series]:
    """Extra candidates and coverage in force over time (0 once a target has expired)."""
    xs: list[float] = []
    extra: list[float] = []
    coverage: list[float] = []
    for i, t in enumerate(targets):
        at = (t.issued_at_ms - info.start_ms) / 1000.0
        xs.append(at)
        extra.append(t.rma.extra_candidates)
        coverage.append(t.sbm.coverage)
        expires = t.issued_at_ms + t.ttl_ms
        following = targets[i + 1].issued_at_ms if i + 1 < len(targets) else info.end_ms
        if expires < following:
            xs.append((expires - info.start_ms) / 1000.0)
            extra.append(0.0)
            coverage.append(0.0)
    return {"extra_candidates": (xs, extra), "coverage": (xs, coverage)}


def time_weighted_mean(series: Series, start_s: float, end_s: float) -> float:
    """Mean of a step function over [start_s, end_s] (0 before its first point)."""
    xs, ys = series
    if end_s <= start_s:
        return 0.0
    total, value, at = 0.0, 0.0, start_s
    for x, y in zip(xs, ys, strict=True):
        if x > at:
            total += value * (min(x, end_s) - at)
            at = min(x, end_s)
        value = y
        if at >= end_s:
            break
    total += value * max(0.0, end_s - at)
    return total / (end_s - start_s)


def lent_series(capacity: list[tuple[int, str, Any]], info: RunInfo,
                step_ms: int = 500) -> Series:
    """Opportunistic accelerator units on the books over time (grants, renewals, revokes,
    preemptions and expiries applied in time order, as the control plane's inventory does)."""
    inventory = PoolInventory()
    xs, ys = [], []
    i = 0
    for t in range(info.start_ms, info.end_ms + step_ms, step_ms):
        while i < len(capacity) and capacity[i][0] <= t:
            _, kind, event = capacity[i]
            if kind == "capacity":
                inventory.apply(event)
            else:
                inventory.preempt(event)
            i += 1
        inventory.expire(t)
        xs.append((t - info.start_ms) / 1000.0)
        ys.append(inventory.available(info.region, t).accel_units)
    return xs, ys


def busy_share_lent(tel: Telemetry, capacity: list[tuple[int, str, Any]],
                    info: RunInfo) -> float | None:
    """Busy share of the opportunistic replicas while capacity was lent: the seconds their
    models were busy (reported utilisation, summed over replicas) over the units lent, over
    the seconds with any lent. None when nothing was lent."""
    _, lent = lent_series(capacity, info, step_ms=1000)
    _, used = per_second(tel, "used_units", info)
    pairs = [(u, n) for u, n in zip(used, lent, strict=False) if n > 0]
    total = sum(n for _, n in pairs)
    return sum(u for u, _ in pairs) / total if total > 0 else None


def limited_by(targets: list[ControlTargets]) -> dict[str, dict[str, int]]:
    """Control periods per lever by what limited the lever's target (as the simulator counts)."""
    tally = LimitTally()
    for t in targets:
        tally.add(t)
    return tally.as_dict()


def per_second(tel: Telemetry, key: str, info: RunInfo) -> Series:
    seconds = range(0, math.ceil((info.end_ms - info.start_ms) / 1000) + 1)
    return ([float(s) for s in seconds],
            [float(tel.per_second.get(s, {}).get(key, 0.0)) for s in seconds])


def shed_reasons(tel: Telemetry) -> list[str]:
    return sorted({k for row in tel.per_second.values() for k in row if k.startswith("shed/")})


# -- the load generator's files ----------------------------------------------------------------

@dataclass
class Requests:
    t_s: np.ndarray
    latency_ms: np.ndarray
    ok: np.ndarray
    model: list[str]
    errors: dict[str, int]


def read_requests(path: Path) -> Requests:
    t, lat, ok, model = [], [], [], []
    errors: dict[str, int] = defaultdict(int)
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            t.append(float(row["t_ms"]) / 1000.0)
            good = row["ok"] == "1"
            ok.append(good)
            lat.append(float(row["latency_ms"]) if good else math.nan)
            model.append(row["model"])
            if not good:
                errors[row["error"] or "unknown"] += 1
    return Requests(np.array(t), np.array(lat), np.array(ok, dtype=bool), model, dict(errors))


def client_windows(req: Requests, info: RunInfo) -> Series:
    """p99 of end-to-end latency per control window, of requests the ranking pool served."""
    ranking = np.array([m == "baseline" for m in req.model], dtype=bool) & req.ok
    period_s = info.period_ms / 1000.0
    xs, ys = [], []
    n = math.ceil(info.duration_s / period_s) if req.t_s.size else 0
    idx = np.floor(req.t_s / period_s).astype(int) if req.t_s.size else np.array([], int)
    for k in range(n):
        sel = ranking & (idx == k)
        if sel.sum() >= info.min_samples:
            xs.append(k * period_s)
            ys.append(float(np.percentile(req.latency_ms[sel], 99)))
    return xs, ys


# -- preemption reaction -----------------------------------------------------------------------

def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative (upper bound, count) buckets."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return buckets[-1][0]


REACTION = "surplus_worker_preemption_reaction_seconds"
#: The part of the reaction that is Kafka's: notice stamped to notice read by the worker.
DELIVERY = "surplus_worker_preemption_delivery_seconds"


NOTICES = "surplus_worker_preemption_notices_total"


def _labelled(metrics: dict[str, str], sample: str) -> Iterator[tuple[dict[str, str], float]]:
    """Every sample named ``sample`` in every worker's /metrics text: its labels and value
    (prometheus-client's own parser of the text format)."""
    for text in metrics.values():
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == sample:
                    yield s.labels, s.value


def notice_paths(metrics: dict[str, str]) -> dict[str, dict[str, int]]:
    """Notices the workers read, by path (``http``, ``kafka``) and outcome, summed over every
    worker's /metrics text: which copy came first (``applied``) and which second."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for labels, value in _labelled(metrics, NOTICES):
        path, outcome = labels["path"], labels["outcome"]
        out[path][outcome] = out[path].get(outcome, 0) + round(value)
    return {path: dict(sorted(v.items())) for path, v in sorted(out.items())}


def reaction_mean_s(metrics: dict[str, str], histogram: str = REACTION) -> float | None:
    """Mean reaction over every worker (the histogram's _sum over its _count)."""
    total = sum(v for _, v in _labelled(metrics, f"{histogram}_sum"))
    count = sum(v for _, v in _labelled(metrics, f"{histogram}_count"))
    return total / count if count else None


def reaction_buckets(metrics: dict[str, str],
                     histogram: str = REACTION) -> list[tuple[float, float]]:
    """Summed cumulative buckets of a reaction histogram over every worker's /metrics text."""
    summed: dict[float, float] = defaultdict(float)
    for labels, value in _labelled(metrics, f"{histogram}_bucket"):
        summed[float(labels["le"])] += value      # float("+Inf") is inf
    return sorted(summed.items())
