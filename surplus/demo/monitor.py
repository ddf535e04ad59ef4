"""What the terminal shows while a run goes: read from the topics and the load generator.

A background consumer follows telemetry and targets (a few messages a second) and keeps only
what the progress line needs: the ranking pools' recent p99 (sketches merged over the last
control period), the targets in force, and worker-side optional work done and shed. The load
generator's per-second line adds the request rate, failures and client-side cuts.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas import kafka_clients
from schemas.codec import ContractError, decode, decode_telemetry
from schemas.contract import ControlTargets, LatencySketch, PrecomputeTarget, WindowReport
from schemas.kafka_clients import OFFSET_END
from schemas.kafka_config import KafkaSettings
from schemas.sketch import SketchMerger, SketchMismatch


@dataclass
class Seen:
    """Totals and recent values, updated by the consumer thread."""

    targets: ControlTargets | None = None
    optional_done: int = 0
    shed: dict[str, int] = field(default_factory=dict)
    baseline_rejected: int = 0
    recent: deque[tuple[int, str, LatencySketch]] = field(
        default_factory=lambda: deque(maxlen=256))


class Monitor:
    """Follows telemetry and targets from now on, on a daemon thread."""

    def __init__(self, kafka: KafkaSettings, window_ms: int) -> None:
        self.kafka = kafka
        self.window_ms = window_ms
        self.seen = Seen()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-monitor", daemon=True)
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        consumer = kafka_clients.consumer(self.kafka, "surplus-demo-monitor", **{
            "enable.auto.commit": False, "client.id": "surplus-demo-monitor"})
        names = {self.kafka.topic(t): t for t in ("telemetry", "targets")}
        try:
            parts = []
            for name in names:
                parts += kafka_clients.starting_at(
                    name, kafka_clients.partitions(consumer, name, timeout_s=10), OFFSET_END)
            consumer.assign(parts)
            while not self._stop.is_set():
                for msg in consumer.consume(500, timeout=0.2):
                    topic, value = msg.topic(), msg.value()
                    if msg.error() is None and topic in names and value is not None:
                        self._take(names[topic], value)
        except Exception as exc:  # the display is best effort; the run goes on without it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _take(self, logical: str, value: bytes) -> None:
        try:
            if logical == "targets":
                targets = decode(ControlTargets, value)
                with self._lock:
                    if self.seen.targets is None or targets.epoch > self.seen.targets.epoch:
                        self.seen.targets = targets
                return
            reports = decode_telemetry(value)  # one report, or a relay's batch of them
        except ContractError:
            return
        with self._lock:
            for report in reports:
                self._add(report)

    def _add(self, report: WindowReport) -> None:
        s = self.seen
        s.optional_done += report.optional_units_done
        s.baseline_rejected += report.baseline_rejected
        for reason, n in report.optional_units_shed.items():
            s.shed[reason] = s.shed.get(reason, 0) + n
        if report.model == "baseline":
            s.recent.append((report.window_end_ms, report.pool_id, report.latency_ms))

    def ranking_p99(self, now_ms: int) -> float | None:
        """Worst ranking pool's p99 over the last window (the control plane's measure)."""
        with self._lock:
            recent = [r for r in self.seen.recent if r[0] > now_ms - self.window_ms]
        by_pool: dict[str, SketchMerger] = {}
        for _, pool, sketch in recent:
            merger = by_pool.setdefault(pool, SketchMerger(sketch.relative_accuracy))
            with contextlib.suppress(SketchMismatch):
                merger.add(sketch)
        p99s = [m.quantile(0.99) for m in by_pool.values() if m.count]
        return max(p99s) if p99s else None

    def snapshot(self) -> tuple[ControlTargets | None, int, dict[str, int], int]:
        with self._lock:
            s = self.seen
            return s.targets, s.optional_done, dict(s.shed), s.baseline_rejected


def last_line(path: Path) -> dict[str, Any] | None:
    """The load generator's latest per-second line, if any."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 4096))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        with contextlib.suppress(ValueError):
            line = json.loads(raw)
            if isinstance(line, dict):
                return line
    return None


def progress_line(t: float, duration_s: float, phase: str, loadgen: Path,
                  monitor: Monitor | None, now_ms: int, sla_p99_ms: float) -> str:
    """The run's progress line at ``t`` seconds into its timeline.

    :param t: seconds into the load (the line says ``starting`` before it).
    :param duration_s: the load's length.
    :param phase: the scenario's phase at ``t``.
    :param loadgen: the load generator's output directory (its ``loadgen.jsonl``).
    :param monitor: the topics' follower (None: before the control plane starts).
    :param now_ms: wall clock now, for the monitor's recent p99.
    :param sla_p99_ms: the ranking pools' SLA, shown beside their p99.
    """
    if t < 0:
        return f"[{t:6.1f}s] starting"
    line = last_line(loadgen / "loadgen.jsonl") or {}
    parts = [f"[{t:5.0f}/{duration_s:.0f}s {phase:8}]",
             f"{line.get('requests', 0):3d} req/s"]
    if monitor is not None:
        p99 = monitor.ranking_p99(now_ms)
        targets, done, shed, _ = monitor.snapshot()
        parts.append("ranking p99 " + ("  -  " if p99 is None else f"{p99:5.1f}")
                     + f" ms (SLA {sla_p99_ms:g})")
        if targets is not None:
            parts.append(f"targets: extra {targets.rma.extra_candidates:3d} "
                         f"({targets.rma.limited_by or '-'}) "
                         f"coverage {targets.sbm.coverage:.2f} "
                         f"({targets.sbm.limited_by or '-'})"
                         + (f" precompute {targets.precompute.share:.2f} "
                            f"({targets.precompute.limited_by or '-'})"
                            if isinstance(targets.precompute, PrecomputeTarget) else ""))
        shed_total = sum(shed.values())
        top = ", ".join(f"{k} {v}" for k, v in sorted(shed.items(), key=lambda kv: -kv[1])
                        [:2])
        parts.append(f"optional done {done:,} shed {shed_total:,}"
                     + (f" ({top})" if top else ""))
    cuts = line.get("client_cuts", {})
    client_cut = sum(v for k, v in cuts.items() if not k.startswith("baseline_only"))
    parts.append(f"client cuts {client_cut:,}")
    parts.append(f"precomputed {line.get('precompute_hits', 0):3d} req/s")
    parts.append(f"failed {failed_requests(loadgen)}")
    return " | ".join(parts)


def failed_requests(loadgen: Path) -> int:
    """Requests the load generator counted as failed so far (its per-second lines summed)."""
    total = 0
    path = loadgen / "loadgen.jsonl"
    with contextlib.suppress(OSError, ValueError), path.open() as fh:
        for raw in fh:
            total += json.loads(raw).get("failed", 0)
    return total
