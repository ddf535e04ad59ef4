"""``oracle``: the best safe targets for each control period, chosen in hindsight.

A controller learns a period's traffic and lent capacity only as the period goes by; the
oracle knows both. For every SLA window (a control period unless the scenario says otherwise)
it looks at the static sweep's runs (``sim.best_static``: every setting of the grid, run on
the same requests, the same capacity and the same storms) and takes, of the settings whose
window was safe (no baseline SLA violation, no rejected baseline request), the one that earned
the most in that window. Its value is the sum over windows of those maxima:

    oracle = sum over windows w of  max { value(s, w) : s in grid, s safe in w }

Because one static setting is safe in every window of the best-static run, the oracle is at
least best-static, window by window; ``value_vs_oracle`` is how much of that hindsight a
controller turns into value.

What it assumes, and so how tight a bound it is:

- Windows are independent. A setting's window is taken from a run that held the setting all
  along, so switching has no cost: queues, the clients' allowances and the segment estimates
  carry over from the same setting, not from the one chosen the window before. That flatters
  the oracle (a real switch pays a ramp).
- Only the grid's settings, held for the whole window, are chosen from. A controller can beat
  it between grid points, within a window (the fast layers react in milliseconds) or by
  routing requests by their value, which a static coverage leaves to the client router alone.
- The max over settings of a noisy window value favours the lucky draw: with the same seed
  every setting sees the same requests, but the latencies and outcomes drawn differ, so the
  per-window maximum is biased upward by the noise of one window's value.

It is an upper bound in the ordinary sense only under the first and third assumptions; read
``value_vs_oracle`` as the share of the per-period hindsight a controller captures, not as a
proof of optimality.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.metrics import TIMELINE_COLUMNS, read_timeline
from streams.replay_output import csv_line, dump_json

NAME = "oracle"


def safe(row: Mapping[str, str]) -> bool:
    """A window with no baseline SLA violation and no rejected baseline request."""
    return not violated(row) and int(row["rejected"]) == 0


def violated(row: Mapping[str, str]) -> bool:
    """The timeline's violation column (written as 0/1)."""
    return row["violation"] not in ("0", "False", "")


def choose(candidates: Mapping[tuple[int, float], Mapping[str, str]]) -> tuple[int, float]:
    """The safe setting that earned most in one window (ties: less optional work); the
    (0, 0) setting when none is safe, as best-static falls back to it."""
    ok = [p for p, row in candidates.items() if safe(row)]
    if not ok:
        return (0, 0.0)
    return min(ok, key=lambda p: (-float(candidates[p]["incremental_value"]), p))


def stitch(sweep: Mapping[tuple[int, float], Path], out: Path) -> dict[str, Any]:
    """Build the oracle from the sweep's run directories (one per grid point): writes
    ``out/timeline.csv`` (the chosen setting's row per window) and ``out/summary.json``."""
    if (0, 0.0) not in sweep:
        raise ValueError("the oracle needs the sweep's (0, 0) run")
    timelines = {p: read_timeline(d / "timeline.csv") for p, d in sweep.items()}
    lengths = {len(rows) for rows in timelines.values()}
    if len(lengths) != 1:
        raise ValueError(f"sweep runs have different timelines ({sorted(lengths)} windows)")
    out.mkdir(parents=True, exist_ok=True)
    chosen_rows: list[dict[str, str]] = []
    picks: dict[str, int] = {}
    for i in range(lengths.pop()):
        window = {p: rows[i] for p, rows in timelines.items()}
        keys = {(row["t_s"], row["region"]) for row in window.values()}
        if len(keys) != 1:
            raise ValueError(f"sweep runs disagree on window {i}: {sorted(keys)}")
        point = choose(window)
        chosen_rows.append(window[point])
        label = f"extra={point[0]} coverage={point[1]:g}"
        picks[label] = picks.get(label, 0) + 1
    with (out / "timeline.csv").open("w", encoding="utf-8", newline="") as fh:
        fh.write(csv_line(TIMELINE_COLUMNS))
        for row in chosen_rows:
            fh.write(csv_line(tuple(row[c] for c in TIMELINE_COLUMNS)))
    summary = _summary(chosen_rows, picks)
    (out / "summary.json").write_text(dump_json(summary), encoding="utf-8")
    return summary


def _summary(rows: list[dict[str, str]], picks: dict[str, int]) -> dict[str, Any]:
    judged = [r for r in rows if int(r["requests"]) > 0]
    return {
        "controller": NAME,
        "windows": len(judged),
        "baseline_sla_violation_windows": sum(violated(r) for r in judged),
        "baseline_requests_rejected": sum(int(r["rejected"]) for r in rows),
        "opportunistic_utilization": None,
        "incremental_value": round(sum(float(r["incremental_value"]) for r in rows), 6),
        "optional_units_shed_total": sum(int(r["optional_units_shed"]) for r in rows),
        "max_notice_to_shed_ms": None,
        "optional_units_done": sum(int(r["optional_units_done"]) for r in rows),
        "e2e_p99_ms": None,
        "overload_shed_share": None,           # per-second sheds: not in the windows it joins
        "overload_shed_share_steady": None,
        "oracle": {"picks": dict(sorted(picks.items(), key=lambda kv: (-kv[1], kv[0]))),
                   "assumes": "independent windows, the static grid's settings, the max of "
                              "each window's value (see sim/oracle.py)"},
    }


def ratio(value: float, oracle: float) -> float | None:
    """``value_vs_oracle``: ``value / oracle``, ``None`` when the oracle earned nothing."""
    return round(value / oracle, 6) if oracle > 0 else None
