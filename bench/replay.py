"""Benchmark: offline replay throughput, against a reference loop doing only decode + merge.

The log is generated: ``workers`` inference workers in two regions (ranking pools on both
tiers and a powerful-model pool), each reporting a WindowReport every second, plus capacity
grants, routing outcomes and one preemption. The replay is the real one
(``streams.replay.replay_offline``: read, decode, drive ScopeControllers, write the CSVs and the
summary). The reference loop reads the same lines and does only what no replay can avoid: one
msgspec decode per line and a ``SketchMerger.add`` per latency sketch. Runs are interleaved, so
a noisy machine slows both and the ratio stays meaningful; the best of ``repeat`` is reported.

    python -m bench.replay [seconds [regions]]      # prints one JSON line

Target: >= 200,000 events/s on one core.
"""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from schemas.contract import (
    CapacityEvent,
    LatencySketch,
    PreemptionNotice,
    RoutingOutcome,
    WindowReport,
)
from schemas.sketch import SketchMerger, new_sketch, to_wire
from streams.control.config import ControlConfig
from streams.eventlog import EventLogWriter, TelemetryEvent, iter_lines
from streams.eventlog import _decoder as line_decoder
from streams.replay import replay_offline

TARGET_EVENTS_PER_S = 200_000
T0 = 1_700_000_000_000
REGIONS = ("eu1", "us1", "ap1", "sa1")
POOLS = (("rank", "baseline", "a100", "baseline"), ("rank", "baseline", "a100", "opportunistic"),
         ("rank", "powerful", "h100", "opportunistic"))


def _sketches(seed: int, n: int = 32) -> list[LatencySketch]:
    """A palette of realistic sketches (lognormal latencies around 20-90 ms, 40-160 samples)."""
    rng = random.Random(seed)
    palette = []
    for i in range(n):
        sketch = new_sketch()
        median = 20.0 + 70.0 * i / n
        for _ in range(rng.randint(40, 160)):
            sketch.add(rng.lognormvariate(math.log(median), 0.35))
        palette.append(to_wire(sketch))
    return palette


def generate_log(path: str | Path, *, workers: int = 100, seconds: int = 600,
                 regions: int = 1, seed: int = 1, outcomes_per_s: int = 20) -> int:
    """Write a ``workers``-worker log of ``seconds`` seconds over ``regions`` scopes (each one
    ticks every period, so more scopes for the same workers cost more ticks per event);
    returns the number of events."""
    rng = random.Random(seed)
    palette = _sketches(seed)
    names = REGIONS[:regions]
    layout = [(names[i % len(names)], POOLS[(i // len(names)) % len(POOLS)], i)
              for i in range(workers)]
    with EventLogWriter(path) as log:
        for s in range(seconds):
            now = T0 + s * 1000
            if s % 10 == 0:
                _grants(log, now, names)
            if s == seconds // 2:
                _preempt(log, now, names[0])
            level = 0.5 + 0.5 * math.sin(2 * math.pi * s / 300)
            for region, (service, model, accel, tier), i in layout:
                pool = f"{region}/{service}/{model}/{accel}/{tier}"
                sketch = palette[min(len(palette) - 1,
                                     int(level * (len(palette) - 8)) + rng.randint(0, 7))]
                log.write_value(now, "telemetry", region, WindowReport(
                    pool_id=pool, worker_id=f"w{i}", region=region, service=service,
                    model=model,  # type: ignore[arg-type]
                    tier=tier,  # type: ignore[arg-type]
                    accelerator=accel, window_start_ms=now - 1000, window_end_ms=now,
                    requests=sketch.count, baseline_requests=sketch.count,
                    optional_units_done=sketch.count * 8, latency_ms=sketch,
                    utilisation=0.4 + 0.4 * level, capacity_rps=200.0,
                    optional_units_shed={"overload": 1} if level > 0.9 else {}))
            for k in range(outcomes_per_s):
                region = names[k % len(names)]
                model = "powerful" if rng.random() < 0.3 else "baseline"
                log.write_value(now + 999, "outcomes", region, RoutingOutcome(
                    ts_ms=now + 999, scope=region, request_id=f"r{s}-{k}",
                    segment=f"seg{rng.randint(0, 9)}", model=model,  # type: ignore[arg-type]
                    value=rng.gauss(1.0 if model == "powerful" else 0.8, 0.2)))
        return log.events


def _grants(log: EventLogWriter, now: int, regions: tuple[str, ...]) -> None:
    for region in regions:
        for service, model, accel, tier in POOLS:
            if tier != "opportunistic":
                continue
            pool = f"{region}/{service}/{model}/{accel}/{tier}"
            log.write_value(now, "capacity", region, CapacityEvent(
                event_id=f"g-{pool}-{now}", ts_ms=now, region=region, pool_id=pool,
                kind="grant", accelerator=accel, accelerator_units=8.0, cpu_units=32.0,
                expires_at_ms=now + 30_000))


def _preempt(log: EventLogWriter, now: int, region: str) -> None:
    pool = f"{region}/rank/powerful/h100/opportunistic"
    log.write_value(now, "preemption", region, PreemptionNotice(
        notice_id=f"p-{now}", ts_ms=now, region=region, pool_id=pool, deadline_ms=now + 1000))


def reference_loop(path: Path) -> int:
    """Decode every line with the same msgspec decoder and merge every sketch; nothing else."""
    decode = line_decoder.decode
    merger = SketchMerger()
    add = merger.add
    n = 0
    for line in iter_lines(path):
        event = decode(line)
        if type(event) is TelemetryEvent:
            add(event.value.latency_ms)
        n += 1
    return n


def run(seconds: int = 600, workers: int = 100, regions: int = 1, repeat: int = 3,
        log: str | Path | None = None) -> dict[str, Any]:
    """Generate (or use) a log, time replay and reference ``repeat`` times, interleaved."""
    with tempfile.TemporaryDirectory(prefix="surplus-bench-replay-") as tmp:
        path = Path(log) if log else Path(tmp) / "bench.jsonl"
        if log is None:
            generate_log(path, workers=workers, seconds=seconds, regions=regions)
        config = ControlConfig()
        replay_best = reference_best = math.inf
        events = 0
        for i in range(repeat):
            started = time.perf_counter()
            summary = replay_offline(path, config, Path(tmp) / f"out{i}")
            replay_best = min(replay_best, time.perf_counter() - started)
            events = summary["read"]["events"]
            started = time.perf_counter()
            reference_loop(path)
            reference_best = min(reference_best, time.perf_counter() - started)
        events_per_s = events / replay_best
        reference_per_s = events / reference_best
        return {
            "bench": "replay",
            "workers": workers,
            "regions": regions,
            "seconds_of_traffic": seconds,
            "events": events,
            "log_bytes": path.stat().st_size,
            "events_per_s": round(events_per_s),
            "reference_events_per_s": round(reference_per_s),
            "ratio_vs_reference": round(events_per_s / reference_per_s, 3),
            "speedup_vs_real_time": round(seconds / replay_best, 1),
            "target_events_per_s": TARGET_EVENTS_PER_S,
            "within_target": events_per_s >= TARGET_EVENTS_PER_S,
        }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(int(args[0]) if args else 600, regions=int(args[1]) if len(args) > 1 else 1)
    print(json.dumps(result))
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
