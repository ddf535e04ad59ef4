"""A soak's samples judged (``growth``) into its summary: at the end of a run, or again later
from what the run left on disk (``surplus soak --report``), as ``surplus demo --report`` does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from surplus.live import plan
from surplus.soak import growth
from surplus.soak.table import table

#: A failure of the run itself (a process died, a start-up failed): kept when judging again.
RUN_FAILED = "the run itself failed (status {code}): see {logs}/logs"
Series = dict[str, dict[str, list[tuple[float, float]]]]


def collect(samples: list[dict[str, Any]]) -> tuple[Series, dict[str, list[int]]]:
    """The sample lines as series (process -> measure -> [(t, value)]) and, per process, the
    pids it ran under in order (more than one: it was replaced)."""
    series: Series = {}
    pids: dict[str, list[int]] = {}
    for line in samples:
        t = float(line["t_s"])
        for name, entry in line["processes"].items():
            seen = pids.setdefault(name, [])
            if not seen or seen[-1] != entry["pid"]:
                seen.append(entry["pid"])
            for measure, value in entry.items():
                if measure != "pid":
                    series.setdefault(name, {}).setdefault(measure, []).append((t, value))
    return series, pids


def summarize(samples: list[dict[str, Any]], expected: dict[str, tuple[str, ...]], *,
              duration_s: float, warmup_s: float, interval_s: float, bound: float,
              period_s: float) -> dict[str, Any]:
    """Every expected process and measure judged, and the failures, as summary.json has them.
    Lag is judged from at least ``growth.LAG_FLOOR`` messages, targets age from two control
    periods (``growth``'s docstring says why)."""
    span = growth.windows(duration_s, warmup_s, interval_s)
    series, pids = collect(samples)
    floors = {"consumer_lag": growth.LAG_FLOOR, "targets_age_s": 2 * period_s}
    verdicts = growth.judge(series, expected, span, bound, floors)
    failures = growth.failures(verdicts)
    failures += [f"{name} pid: replaced during the run ({' -> '.join(map(str, seen))})"
                 for name, seen in pids.items() if len(seen) > 1]
    processes: dict[str, dict[str, Any]] = {
        name: {"pid": pids.get(name, [None])[-1], "measures": {}} for name in expected}
    for v in verdicts:
        processes[v.process]["measures"][v.measure] = {
            "start": v.start, "end": v.end, "growth": v.growth, "ok": v.ok,
            "samples": v.samples, **({"floor": v.floor} if v.floor else {}),
            **({"why": v.why} if v.why else {})}
    return {"ok": not failures, "failures": failures, "duration_s": duration_s,
            "warmup_s": warmup_s, "interval_s": interval_s, "window_s": span.window_s,
            "bound": bound, "period_s": period_s, "samples": len(samples),
            "processes": processes}


def rejudge(out: Path) -> dict[str, Any]:
    """The summary of the run in ``out`` judged again from its samples.jsonl, with the
    processes, measures and settings its summary.json names (the control period from its
    scenario where it does not name it)."""
    old = json.loads((out / "summary.json").read_text())
    period_s = old.get("period_s") or plan.load(old["scenario"])[0].control.period_ms / 1000.0
    with (out / "samples.jsonl").open() as fh:
        samples = [json.loads(line) for line in fh if line.strip()]
    expected = {name: tuple(p["measures"]) for name, p in old["processes"].items()}
    new = summarize(samples, expected, duration_s=old["duration_s"],
                    warmup_s=old["warmup_s"], interval_s=old["interval_s"],
                    bound=old["bound"], period_s=period_s)
    run_failed = [f for f in old["failures"] if f.startswith("the run itself failed")]
    new["failures"] += run_failed
    return {**old, **new, "ok": new["ok"] and not run_failed}


def write(out: Path, summary: dict[str, Any], say: Callable[[str], None]) -> None:
    """summary.json and soak.txt (the table) in ``out``; the table and each failure said."""
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = table(summary)
    (out / "soak.txt").write_text(text + "\n")
    say(text)
    for line in summary["failures"]:
        say(f"soak: FAILED {line}")
    say(f"soak: summary {out / 'summary.json'}  table {out / 'soak.txt'}  samples "
        f"{out / 'samples.jsonl'}")
