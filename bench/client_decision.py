"""Benchmark: the client's per-request decision (targets lookup + SBM routing + shed check +
RMA budget), against a reference loop doing only a dict lookup and one random draw.

Both loops run interleaved in batches in the same process, so a noisy machine slows both and
the ratio stays meaningful. The target is a median of at most 10 µs per decision.

    python -m bench.client_decision [n]     # prints one JSON line
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from typing import Any

from schemas.contract import ControlTargets, RmaTarget, SbmTarget, SegmentPriority
from workers.client.config import ClientConfig
from workers.client.decision import Decider

TARGET_NS = 10_000
BATCH = 100
SEGMENTS = 50
T0 = 1_700_000_000_000


def _decider() -> Decider:
    config = ClientConfig(scope="eu1", baseline_urls=["http://127.0.0.1:1"],
                          powerful_urls=["http://127.0.0.1:2"], seed=1)
    decider = Decider(config)
    segments = {f"seg{i}": SegmentPriority(gain_mean=i / SEGMENTS, gain_std=0.05)
                for i in range(SEGMENTS)}
    targets = ControlTargets(scope="eu1", epoch=1, issued_at_ms=T0, ttl_ms=86_400_000,
                             rma=RmaTarget(extra_candidates=64, budget_units_per_s=1e7),
                             sbm=SbmTarget(coverage=0.3, segments=segments))
    verdict = decider.offer(targets, T0)
    assert verdict.accepted, verdict
    return decider


def _time_decisions(decider: Decider, names: list[str], start: int) -> int:
    decide = decider.decide
    t = time.perf_counter_ns()
    for i in range(start, start + BATCH):
        decide(names[i % SEGMENTS], 200, T0 + i // 10)
    return time.perf_counter_ns() - t


def _time_reference(table: dict[str, float], names: list[str], start: int) -> int:
    draw = random.random
    t = time.perf_counter_ns()
    for i in range(start, start + BATCH):
        table[names[i % SEGMENTS]] < draw()  # noqa: B015 - the work being timed
    return time.perf_counter_ns() - t


def run(n: int = 200_000) -> dict[str, Any]:
    """Time `n` decisions and `n` reference steps; medians are per item, over batches."""
    decider = _decider()
    names = [f"seg{i}" for i in range(SEGMENTS)]
    table = {name: 0.3 for name in names}
    random.seed(1)
    for start in range(0, 5_000, BATCH):                          # warm up both paths
        _time_decisions(decider, names, start)
        _time_reference(table, names, start)
    decisions: list[float] = []
    reference: list[float] = []
    for start in range(5_000, 5_000 + max(n, BATCH), BATCH):
        decisions.append(_time_decisions(decider, names, start) / BATCH)
        reference.append(_time_reference(table, names, start) / BATCH)
    median_ns = statistics.median(decisions)
    reference_ns = statistics.median(reference)
    return {
        "bench": "client_decision",
        "n": len(decisions) * BATCH,
        "decision_us_median": round(median_ns / 1000.0, 3),
        "median_ns": round(median_ns, 1),
        "p90_ns": round(statistics.quantiles(decisions, n=10)[-1], 1),
        "reference_median_ns": round(reference_ns, 1),
        "ratio": round(median_ns / reference_ns, 2),
        "target_ns": TARGET_NS,
        "within_target": median_ns <= TARGET_NS,
        "replans": decider.router.replans,
        "powerful_share": round(sum(decider.counters.get("sbm_routed", {}).values())
                                / decider.counters["requests"]["total"], 4),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(int(args[0]) if args else 200_000)
    print(json.dumps(result))
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
