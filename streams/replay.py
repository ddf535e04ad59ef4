"""Offline replay: the live control loop, run over an event log on a virtual clock, no Kafka.

``ControlDriver`` is the one piece that turns a time-ordered stream of logged events into calls
on ``streams.control.ScopeController`` — one controller per scope, created on the scope's first
event — and ticks them on a fixed grid of event time: every multiple of ``period_s`` since the
epoch. Events stamped at or before a tick belong to the period that tick closes. The fleet
simulator drives its control plane through the same driver, in the same order it writes its
log, so replaying a simulation's log reproduces the simulation's targets exactly.

``replay_offline`` writes, into one directory:

- ``targets.csv``: every ControlTargets the controllers emitted (``source=replay``), and those
  the log itself recorded from a live control plane (``source=recorded``), in time order;
- ``windows.csv``: every latency window a tick closed (what the controllers saw);
- ``summary.json``: what was read, what was rejected and why, and per scope what the targets
  did and how often the ranking pools were over their SLA.

Nothing in them depends on the wall clock, the machine or the directory: the same log and the
same settings give byte-identical files. ``compare_offline`` runs several settings over one log
and adds a side-by-side ``summary.json`` and an HTML page with plots (``streams.replay_report``).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from schemas.contract import ControlTargets
from schemas.sketch import SketchMismatch
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController, ScopeMismatch
from streams.control.windows import TooManyPools, WindowStats
from streams.eventlog import (
    AnyEvent,
    CapacityLogEvent,
    OutcomeEvent,
    PreemptionEvent,
    TargetsEvent,
    TelemetryEvent,
    read_events,
)

TargetsHook = Callable[[ControlTargets, ScopeController], None]
TickHook = Callable[[int, ScopeController], None]
RecordedHook = Callable[[TargetsEvent], None]


class ControlDriver:
    """Feeds logged events to per-scope ``ScopeController``s and ticks them on a virtual clock.

    ``feed`` takes events in time order; an event older than the last tick (a late message of
    a tapped stream) is applied at the last tick's time and counted in ``late``. Events whose
    key is not their scope, or that a controller refuses (unlike sketches, too many pools), are
    counted in ``rejected`` by reason, as the live agent dead-letters them. Hooks see every
    emitted target (``on_targets``), every tick (``on_tick``) and recorded targets in the log
    (``on_recorded``, never fed to a controller).
    """

    def __init__(self, config: ControlConfig, *, on_targets: TargetsHook | None = None,
                 on_tick: TickHook | None = None,
                 on_recorded: RecordedHook | None = None) -> None:
        self.config = config
        self.period_ms = config.period_ms
        self.controllers: dict[str, ScopeController] = {}
        self.on_targets = on_targets
        self.on_tick = on_tick
        self.on_recorded = on_recorded
        self.rejected: dict[str, int] = {}
        self.n_telemetry = self.n_capacity = self.n_preemption = 0
        self.n_targets = self.n_outcomes = 0
        self.late = 0
        self.ticks = 0
        self.first_ts: int | None = None
        self.last_ts: int | None = None
        self.last_tick_ms: int | None = None
        self._next_tick = -math.inf
        self._floor = -math.inf
        self._late_since = False

    # -- the clock ---------------------------------------------------------------------------

    def advance(self, now_ms: int) -> None:
        """Run every tick due at or before ``now_ms`` (all events up to it have been fed)."""
        if self.first_ts is None:
            return
        while self._next_tick <= now_ms:
            self._tick(int(self._next_tick))

    def finish(self) -> None:
        """Close the last, partial period if events arrived after the last tick."""
        if self.first_ts is None or self.last_ts is None:
            return
        if self.last_tick_ms is None or self.last_ts > self.last_tick_ms or self._late_since:
            self._tick(int(self._next_tick))

    def _tick(self, tick_ms: int) -> None:
        self.ticks += 1
        self.last_tick_ms = tick_ms
        self._floor = tick_ms
        self._next_tick = tick_ms + self.period_ms
        self._late_since = False
        for scope in sorted(self.controllers):
            controller = self.controllers[scope]
            targets = controller.tick(tick_ms)
            if self.on_tick is not None:
                self.on_tick(tick_ms, controller)
            if self.on_targets is not None:
                self.on_targets(targets, controller)

    def _start(self, ts: int) -> None:
        self.first_ts = ts
        self._next_tick = (ts // self.period_ms + 1) * self.period_ms

    # -- events ------------------------------------------------------------------------------

    def feed(self, event: AnyEvent) -> None:
        """Apply one event at its timestamp (ticks that fall before it run first).

        The common case (a WindowReport inside the open period) is kept to a few attribute
        reads and one call into the controller: offline replay runs it 200,000+ times a second.
        """
        ts = event.ts
        if ts > self._next_tick or ts < self._floor:
            ts = self._clock_slow(ts)
        self.last_ts = ts
        cls = type(event)
        if cls is TelemetryEvent:
            self.n_telemetry += 1
            report = event.value
            controller = self.controllers.get(event.key)  # type: ignore[arg-type]
            if controller is None or event.key != report.region:  # type: ignore[union-attr]
                controller = self._controller(report.region, event.key)  # type: ignore[union-attr]
                if controller is None:
                    return
            try:
                controller.on_report(report, ts)  # type: ignore[arg-type]
            except (SketchMismatch, TooManyPools, ScopeMismatch) as exc:
                self._reject(type(exc).__name__)
        elif cls is OutcomeEvent:
            self.n_outcomes += 1
            outcome = event.value
            controller = self._controller(outcome.scope, event.key)  # type: ignore[union-attr]
            if controller is not None:
                controller.on_outcome(outcome, ts)  # type: ignore[arg-type]
        elif cls is CapacityLogEvent:
            self.n_capacity += 1
            capacity = event.value
            controller = self._controller(capacity.region, event.key)  # type: ignore[union-attr]
            if controller is not None:
                controller.on_capacity(capacity, ts)  # type: ignore[arg-type]
        elif cls is PreemptionEvent:
            self.n_preemption += 1
            notice = event.value
            controller = self._controller(notice.region, event.key)  # type: ignore[union-attr]
            if controller is not None:
                targets = controller.on_preemption(notice, ts)  # type: ignore[arg-type]
                if self.on_targets is not None:
                    self.on_targets(targets, controller)
        else:
            self.n_targets += 1
            if self.on_recorded is not None:
                self.on_recorded(event)  # type: ignore[arg-type]

    def _clock_slow(self, ts: int) -> int:
        """The first event, an event past the next tick, or a late one: the time to apply at."""
        if self.first_ts is None:
            self._start(ts)
        if ts > self._next_tick:
            self.advance(ts - 1)
        if ts < self._floor:
            self.late += 1
            self._late_since = True
            return int(self._floor)
        return ts

    @property
    def by_topic(self) -> dict[str, int]:
        """Events fed, by logical topic (topics with none are left out)."""
        counts = {"telemetry": self.n_telemetry, "capacity": self.n_capacity,
                  "preemption": self.n_preemption, "targets": self.n_targets,
                  "outcomes": self.n_outcomes}
        return {topic: n for topic, n in counts.items() if n}

    def _controller(self, scope: str, key: str | None) -> ScopeController | None:
        """The scope's controller (created on first use); None when the key lies."""
        if key != scope:
            self._reject("key_mismatch")
            return None
        controller = self.controllers.get(scope)
        if controller is None:
            controller = self.controllers[scope] = ScopeController(scope, self.config)
        return controller

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def run(self, events: Iterable[AnyEvent]) -> None:
        feed = self.feed
        for event in events:
            feed(event)
        self.finish()


# -- outputs --------------------------------------------------------------------------------------

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


def replay_offline(log: str | Path, config: ControlConfig, out_dir: str | Path, *,
                   strict: bool = False, progress: bool = False,
                   label: str | None = None) -> dict[str, Any]:
    """Run ``config``'s control loop over ``log``; write the outputs; return the summary."""
    log, out = Path(log), Path(out_dir)
    reader = read_events(log, strict=strict)
    output = ReplayOutput(out, config)
    driver = ControlDriver(config, on_targets=output.on_targets, on_tick=output.on_tick,
                           on_recorded=output.on_recorded)
    meter = Progress(f"replay {label or log.name}", enabled=progress)
    try:
        feed = driver.feed
        if progress:
            for n, event in enumerate(reader, 1):
                feed(event)
                if not n & 0xFFFF:
                    meter.update(f"{n:,} events")
        else:
            for event in reader:
                feed(event)
        driver.finish()
    finally:
        output.close()
    summary = {
        "log": log.name,
        "log_bytes": log.stat().st_size,
        "config_digest": config_digest(config),
        "config": msgspec.to_builtins(config),
        "read": reader.stats(),
        "events_by_topic": dict(sorted(driver.by_topic.items())),
        "rejected": dict(sorted(driver.rejected.items())),
        "late_events": driver.late,
        "first_ts_ms": driver.first_ts,
        "last_ts_ms": driver.last_ts,
        "ticks": driver.ticks,
        "period_s": config.period_s,
        "scopes": output.scope_summaries(),
    }
    (out / "summary.json").write_text(dump_json(summary), encoding="utf-8")
    meter.done(f"{reader.events:,} events, {driver.ticks:,} ticks -> {out}")
    return summary


def compare_offline(log: str | Path, configs: list[tuple[str, ControlConfig]],
                    out_dir: str | Path, *, strict: bool = False,
                    progress: bool = False) -> dict[str, Any]:
    """Replay ``log`` once per (label, config) into ``out_dir/label``; side-by-side report."""
    out = Path(out_dir)
    labels = [label for label, _ in configs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"compare labels must differ, got {labels}")
    runs = {label: replay_offline(log, config, out / label, strict=strict, progress=progress,
                                  label=label)
            for label, config in configs}
    summary = {"log": Path(log).name, "labels": labels, "runs": runs,
               "table": comparison_table(runs)}
    (out / "summary.json").write_text(dump_json(summary), encoding="utf-8")
    from streams.replay_report import write_compare_report

    write_compare_report(out, labels)
    return summary


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
