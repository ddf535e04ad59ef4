"""What offline replay writes, and the one style of result files shared with the simulator.

``ReplayOutput`` takes ``streams.replay.ControlDriver``'s hooks and writes, into one directory:

- ``targets.csv``: every ControlTargets the controllers emitted (``source=replay``), and those
  the log itself recorded from a live control plane (``source=recorded``), in time order;
- ``windows.csv``: every latency window a tick closed (what the controllers saw);

and keeps per scope what the targets did and how often the ranking pools were over their SLA
(``scope_summaries``, for ``summary.json``). CSV cells (``fmt``, ``csv_line``) and JSON files
(``dump_json``) are written in a fixed, platform-independent form, so the same inputs give
byte-identical files. ``Progress`` is the one-line progress report of long commands;
``comparison_table`` the headline numbers of several runs side by side.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from schemas.contract import ControlTargets
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from streams.control.windows import WindowStats
from streams.eventlog import TargetsEvent

TARGET_COLUMNS = ("ts_ms", "scope", "source", "epoch", "reason", "extra_candidates",
                  "budget_units_per_s", "coverage", "segments", "capacity_accel_units",
                  "rma_accel_units", "sbm_accel_units", "expected_value", "ranking_p99_ms")
WINDOW_COLUMNS = ("tick_ms", "scope", "pool_id", "model", "tier", "accelerator", "reports",
                  "samples", "p50_ms", "p99_ms", "request_rate", "baseline_rate",
                  "optional_done_rate", "shed_rate", "utilisation", "capacity_rps",
                  "enough_samples")


def fmt(value: Any) -> str:
    """One CSV cell: fixed, platform-independent text for every value type used here."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        text = f"{value:.9g}"
        return "0" if text == "-0" else text
    if value is None:
        return ""
    return str(value)


def csv_line(values: Iterable[Any]) -> str:
    return ",".join(fmt(v) for v in values) + "\n"


@dataclass
class _Series:
    """Running aggregate of one number (count, sum, max, last)."""

    n: int = 0
    total: float = 0.0
    top: float = -math.inf
    last: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.total += x
        self.last = x
        if x > self.top:
            self.top = x

    def as_dict(self) -> dict[str, float]:
        return {"mean": round(self.total / self.n, 6) if self.n else 0.0,
                "max": round(self.top, 6) if self.n else 0.0, "last": round(self.last, 6)}


@dataclass
class _ScopeSummary:
    targets_by_reason: dict[str, int] = field(default_factory=dict)
    extra: _Series = field(default_factory=_Series)
    coverage: _Series = field(default_factory=_Series)
    budget: _Series = field(default_factory=_Series)
    ranking_p99: _Series = field(default_factory=_Series)
    powerful_p99: _Series = field(default_factory=_Series)
    ranking_windows: int = 0
    ranking_violations: int = 0
    powerful_windows: int = 0
    powerful_violations: int = 0
    recorded_targets: int = 0
    last_epoch: int = 0


class ReplayOutput:
    """Collects the driver's outputs into the CSV files and the summary, deterministically."""

    def __init__(self, out_dir: Path, config: ControlConfig) -> None:
        self.out_dir = out_dir
        self.config = config
        out_dir.mkdir(parents=True, exist_ok=True)
        self._targets: IO[str] = (out_dir / "targets.csv").open("w", encoding="utf-8",
                                                                 newline="")
        self._windows: IO[str] = (out_dir / "windows.csv").open("w", encoding="utf-8",
                                                                 newline="")
        self._targets.write(csv_line(TARGET_COLUMNS))
        self._windows.write(csv_line(WINDOW_COLUMNS))
        self.scopes: dict[str, _ScopeSummary] = {}

    def _scope(self, scope: str) -> _ScopeSummary:
        summary = self.scopes.get(scope)
        if summary is None:
            summary = self.scopes[scope] = _ScopeSummary()
        return summary

    def on_targets(self, targets: ControlTargets, controller: ScopeController) -> None:
        alloc = controller.allocation
        capacity = controller.capacity
        p99 = controller.rma_policy.last_p99_ms
        self._targets.write(csv_line((
            targets.issued_at_ms, targets.scope, "replay", targets.epoch, targets.reason,
            targets.rma.extra_candidates, targets.rma.budget_units_per_s, targets.sbm.coverage,
            len(targets.sbm.segments), capacity.accel_units, alloc.rma_accel_units,
            alloc.sbm_accel_units, alloc.expected_value, p99)))
        s = self._scope(targets.scope)
        s.targets_by_reason[targets.reason] = s.targets_by_reason.get(targets.reason, 0) + 1
        s.extra.add(float(targets.rma.extra_candidates))
        s.coverage.add(targets.sbm.coverage)
        s.budget.add(targets.rma.budget_units_per_s)
        s.last_epoch = targets.epoch

    def on_recorded(self, event: TargetsEvent) -> None:
        t = event.value
        self._targets.write(csv_line((
            event.ts, t.scope, "recorded", t.epoch, t.reason, t.rma.extra_candidates,
            t.rma.budget_units_per_s, t.sbm.coverage, len(t.sbm.segments), None, None, None,
            None, None)))
        self._scope(t.scope).recorded_targets += 1

    def on_tick(self, tick_ms: int, controller: ScopeController) -> None:
        s = self._scope(controller.scope)
        rma_sla = self.config.rma.sla_p99_ms
        sbm_sla = self.config.sbm.sla_p99_ms
        write = self._windows.write
        for w in controller.last_windows:
            write(csv_line((tick_ms, controller.scope, w.pool_id, w.model, w.tier,
                            w.accelerator, w.reports, w.samples, w.p50_ms, w.p99_ms,
                            w.request_rate, w.baseline_rate, w.optional_done_rate, w.shed_rate,
                            w.utilisation, w.capacity_rps, w.enough_samples)))
            self._judge(s, w, rma_sla, sbm_sla)

    @staticmethod
    def _judge(s: _ScopeSummary, w: WindowStats, rma_sla: float, sbm_sla: float) -> None:
        if not w.enough_samples:
            return
        if w.model == "baseline":
            s.ranking_windows += 1
            s.ranking_p99.add(w.p99_ms)
            s.ranking_violations += w.p99_ms > rma_sla
        else:
            s.powerful_windows += 1
            s.powerful_p99.add(w.p99_ms)
            s.powerful_violations += w.p99_ms > sbm_sla

    def close(self) -> None:
        self._targets.close()
        self._windows.close()

    def scope_summaries(self) -> dict[str, Any]:
        return {scope: {
            "targets": sum(s.targets_by_reason.values()),
            "targets_by_reason": dict(sorted(s.targets_by_reason.items())),
            "last_epoch": s.last_epoch,
            "recorded_targets": s.recorded_targets,
            "extra_candidates": s.extra.as_dict(),
            "budget_units_per_s": s.budget.as_dict(),
            "coverage": s.coverage.as_dict(),
            "ranking_windows": s.ranking_windows,
            "ranking_sla_violation_windows": s.ranking_violations,
            "ranking_p99_ms": s.ranking_p99.as_dict(),
            "powerful_windows": s.powerful_windows,
            "powerful_sla_violation_windows": s.powerful_violations,
            "powerful_p99_ms": s.powerful_p99.as_dict(),
        } for scope, s in sorted(self.scopes.items())}


def config_digest(config: ControlConfig) -> str:
    """Short, stable fingerprint of a configuration (to tell runs apart in reports)."""
    return hashlib.sha256(msgspec.json.encode(config)).hexdigest()[:16]


def dump_json(obj: Any) -> str:
    """The one JSON style of result files: sorted keys, two-space indent, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"


class Progress:
    """A one-line progress report on stderr, at most once per ``every_s`` seconds."""

    def __init__(self, label: str, every_s: float = 1.0, stream: IO[str] | None = None,
                 enabled: bool = True) -> None:
        self.label = label
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.started = time.monotonic()
        self._next = self.started + every_s
        self._shown = False

    def update(self, text: str, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if force or now >= self._next:
            self._next = now + self.every_s
            self.stream.write(f"\r{self.label}: {text} ({now - self.started:.1f}s)\x1b[K")
            self.stream.flush()
            self._shown = True

    def done(self, text: str) -> None:
        if not self.enabled:
            return
        self.update(text, force=True)
        self.stream.write("\n")
        self.stream.flush()


def comparison_table(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per label, the headline numbers summed or averaged over scopes."""
    table: dict[str, dict[str, Any]] = {}
    for label, run in runs.items():
        scopes = run["scopes"].values()
        table[label] = {
            "config_digest": run["config_digest"],
            "targets": sum(s["targets"] for s in scopes),
            "mean_extra_candidates": _mean(s["extra_candidates"]["mean"] for s in scopes),
            "mean_coverage": _mean(s["coverage"]["mean"] for s in scopes),
            "ranking_sla_violation_windows": sum(s["ranking_sla_violation_windows"]
                                                 for s in scopes),
            "powerful_sla_violation_windows": sum(s["powerful_sla_violation_windows"]
                                                  for s in scopes),
            "max_ranking_p99_ms": max((s["ranking_p99_ms"]["max"] for s in scopes),
                                      default=0.0),
        }
    return table


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return round(sum(items) / len(items), 6) if items else 0.0
