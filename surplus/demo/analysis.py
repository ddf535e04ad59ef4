"""What a run did, computed from what it recorded: the event log, the load generator's files and
the workers' preemption-reaction histograms. No clock, no Kafka: the same files give the same
numbers, so a report can be rebuilt from a run directory at any time (``surplus demo --report``).

Definitions (the ones ``summary.json`` states):

- *baseline SLA window*: every control period (``period_s``) of the load phase in which any
  baseline request was served, on every such request whichever path served it: the requests
  the ranking replicas served (model ``baseline``, either tier) against ``rma.sla_p99_ms``, and
  those routed to the powerful model against their deadline (the region's ``deadline_ms``).
  It is a *violation* when the p99 of either path is over its bound: the ranking path's p99
  over all its replicas' reports merged, or any one ranking pool's with at least
  ``min_samples`` latencies (the control plane's measure, on the same grid), or the powerful
  path's p99 over all its replicas. A path with few requests in a window is judged on them
  (their p99 is about their slowest), never skipped: with coverage near 1 the ranking path
  carries few requests, and a window left unjudged would be one nobody checked.
- *client SLA window*: the same verdict on the load generator's end-to-end latencies
  (``requests.csv``), where a request routed to the powerful model that fell back to the
  ranking pool is judged, whole, against its deadline.
- *optional unit*: one candidate row scored beyond the request's baseline work — an RMA extra
  candidate, or any row of a request served by the powerful model. Done and worker-side shed
  units come from the workers' WindowReports; client-side cuts (extra candidates the client did
  not send because of its budget or overload allowance, and requests kept off the powerful
  model by overload, counted at ``base_candidates`` rows each) from the client's counters.
- *opportunistic busy share while lent*: with CPU slices (``slices``), the CPU time the
  opportunistic replicas' cgroups used over their quota time, from each replica's readiness
  to its reclaim; without them, the model busy time the replicas reported over the units lent
  (``opportunistic_busy_share_method`` says which).
- *incremental value*: the scenario's true (noise-free) gain of the optional work actually done.
- *notice to shed*: PreemptionNotice ``ts_ms`` to optional work stopped on the worker, from each
  worker's ``surplus_worker_preemption_reaction_seconds`` histogram, p99 interpolated within
  its bucket the way Prometheus' ``histogram_quantile`` does.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

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
from surplus.demo.slices import Sample

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
    deadline_ms: float | None = None
    """The region's request deadline: what a request routed to the powerful model is judged
    against (None in a run.json from before it was recorded: that path is not judged)."""
    slices: dict[str, Any] = field(default_factory=dict)
    """The opportunistic replicas' CPU slices: ``mode`` (cgroup-v1, cgroup-v2 or none),
    ``reason`` when none, ``cores`` per replica, ``period_us``."""

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
    ranking: dict[int, SketchMerger] = field(default_factory=dict)
    """Every ranking replica's latencies of a window merged (the ranking path's requests)."""
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
        tel.ranking.setdefault(window, SketchMerger(sketch.relative_accuracy)).add(sketch)
    else:
        tel.powerful.setdefault(window, SketchMerger(sketch.relative_accuracy)).add(sketch)


# -- latency windows ------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """One control period's verdict on the baseline requests of both paths."""

    index: int
    start_s: float
    p99_ms: float | None
    """The ranking path's p99 (the worse of all its replicas merged and of each pool with
    ``min_samples``); None with no ranking request in the window."""
    samples: int
    judged: bool
    violated: bool
    powerful_p99_ms: float | None = None
    powerful_samples: int = 0
    over: tuple[str, ...] = ()
    """The paths over their bound (``ranking``, ``powerful``)."""


def ranking_p99(merged: SketchMerger | None, pools: dict[str, SketchMerger],
                min_samples: int) -> tuple[float | None, int]:
    """A window's ranking p99: over every ranking replica's report merged, or the worst pool
    that reported at least ``min_samples`` (the control plane's measure) if that is higher."""
    if merged is None or not merged.count:
        return None, 0
    worst = max((m.quantile(0.99) for m in pools.values() if m.count >= min_samples),
                default=0.0)
    return max(merged.quantile(0.99), worst), merged.count


def judge(index: int, start_s: float, ranking: tuple[float | None, int],
          powerful: tuple[float | None, int], sla_ms: float,
          deadline_ms: float | None) -> Window:
    """One window's verdict from each path's (p99, requests): judged when any baseline request
    was served in it, violated when a path's p99 is over its bound (the ranking SLA; the
    deadline for requests routed to the powerful model)."""
    (r99, rn), (p99, pn) = ranking, powerful
    if deadline_ms is None:
        p99, pn = None, 0
    over = tuple(name for name, q, bound in (("ranking", r99, sla_ms),
                                             ("powerful", p99, deadline_ms))
                 if q is not None and bound is not None and q > bound)
    return Window(index, start_s, r99, rn, rn + pn > 0, bool(over), p99, pn, over)


def sla_windows(tel: Telemetry, info: RunInfo) -> list[Window]:
    """Every control window of the load, judged on both paths from the workers' reports."""
    out = []
    n = math.ceil((info.end_ms - info.start_ms) / info.period_ms)
    for k in range(n):
        powerful = tel.powerful.get(k)
        out.append(judge(k, k * info.period_ms / 1000.0,
                         ranking_p99(tel.ranking.get(k), tel.windows.get(k, {}),
                                     info.min_samples),
                         (powerful.quantile(0.99) if powerful and powerful.count else None,
                          powerful.count if powerful else 0),
                         info.sla_p99_ms, info.deadline_ms))
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


def read_slices(path: Path) -> list[tuple[float, Sample]]:
    """The slices' usage samples the run recorded (``slices.jsonl``): (seconds into the run,
    sample). Empty when the run had no slices or the file is missing."""
    out = []
    with contextlib.suppress(OSError), path.open() as fh:
        for raw in fh:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                row = json.loads(raw)
                out.append((float(row["t_s"]), Sample(
                    worker_id=str(row["worker_id"]), life=int(row["life"]),
                    t_s=float(row["mono_s"]), usage_usec=int(row["usage_usec"]),
                    cores=float(row["cores"]), lent=bool(row["lent"]))))
    return out


def slice_busy_per_second(samples: list[tuple[float, Sample]], info: RunInfo) -> Series:
    """Each second's busy share of the slices in units of one whole slice (a replica using
    its full quota adds 1), comparable with the units lent: what the capacity plot shows.
    A stretch between two samples counts in the second it ends in."""
    seconds = math.ceil((info.end_ms - info.start_ms) / 1000) + 1
    used: dict[tuple[int, str], float] = defaultdict(float)
    quota: dict[tuple[int, str], float] = defaultdict(float)
    last: dict[str, Sample] = {}
    for at, s in sorted(samples, key=lambda p: (p[1].worker_id, p[1].life, p[1].t_s)):
        prev = last.get(s.worker_id)
        last[s.worker_id] = s
        if prev is None or prev.life != s.life or not (prev.lent and s.lent):
            continue
        key = (int(at), s.worker_id)
        used[key] += max(0, s.usage_usec - prev.usage_usec) / 1e6
        quota[key] += prev.cores * max(0.0, s.t_s - prev.t_s)
    row = [0.0] * seconds
    for (second, _), q in quota.items():
        if q > 0 and 0 <= second < seconds:
            row[second] += used[(second, _)] / q
    return [float(i) for i in range(seconds)], row


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
    fell_back: np.ndarray | None = None
    """Requests routed to the powerful model that the ranking pool served in the end."""

    def routed_powerful(self) -> np.ndarray:
        """Requests routed to the powerful model, whichever replica served them in the end."""
        powerful = np.array([m == "powerful" for m in self.model], dtype=bool)
        return powerful | (self.fell_back if self.fell_back is not None
                           else np.zeros_like(powerful))


def read_requests(path: Path) -> Requests:
    t, lat, ok, model, fell = [], [], [], [], []
    errors: dict[str, int] = defaultdict(int)
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            t.append(float(row["t_ms"]) / 1000.0)
            good = row["ok"] == "1"
            ok.append(good)
            lat.append(float(row["latency_ms"]) if good else math.nan)
            model.append(row["model"])
            fell.append(row.get("fell_back") in ("1", "True", "true"))
            if not good:
                errors[row["error"] or "unknown"] += 1
    return Requests(np.array(t), np.array(lat), np.array(ok, dtype=bool), model, dict(errors),
                    np.array(fell, dtype=bool))


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


def client_sla_windows(req: Requests, info: RunInfo) -> list[Window]:
    """Every control window judged on every baseline request the load generator saw, end to
    end: those routed to the powerful model (fallbacks included, whole) against the deadline,
    the rest against the ranking SLA. A failed request is judged as infinitely late."""
    period_s = info.period_ms / 1000.0
    n = math.ceil(info.duration_s / period_s)
    idx = np.floor(req.t_s / period_s).astype(int) if req.t_s.size else np.array([], int)
    latency = np.where(req.ok, req.latency_ms, np.inf)
    powerful = req.routed_powerful()
    out = []
    for k in range(n):
        here = idx == k
        paths = [_p99(latency[here & ~powerful]), _p99(latency[here & powerful])]
        out.append(judge(k, k * period_s, paths[0], paths[1], info.sla_p99_ms,
                         info.deadline_ms))
    return out


def _p99(latencies: np.ndarray) -> tuple[float | None, int]:
    """The p99 of a path's requests in a window (the nearest rank at or above 99%, so a window
    of few requests is judged by its slowest), and how many there were."""
    if not latencies.size:
        return None, 0
    ordered = np.sort(latencies)
    rank = max(0, math.ceil(0.99 * ordered.size) - 1)
    return float(ordered[rank]), int(ordered.size)
