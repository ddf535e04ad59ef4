"""``best-static``: the best fixed setting, chosen with hindsight.

The ``static`` controller is run over a grid of extra candidates x coverage (the scenario's
``[controllers.best_static]``, or ``--static-grid``); of the runs with no baseline
SLA-violation window and no rejected baseline request, the one with the most incremental value
is ``best-static`` (ties go to less optional work: fewer extra candidates, then less
coverage). The point (0, 0), no optional work, is always run: when no run qualifies (the
baseline alone breaks the SLA) it is the one chosen, flagged ``qualifying: false``.

An adaptive controller earns its keep only if it beats this bar: ``value_vs_best_static`` is a
controller's incremental value over best-static's, ``null`` when best-static's is 0 (no fixed
setting earned anything safely, so there is nothing to divide by).

Runs are independent, so they go to a pool of ``jobs`` processes; every run is deterministic
and results are ordered by grid point, so the pool size never changes a result file.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from sim import pool
from sim.scenario import BestStaticConfig, Scenario, StaticConfig
from streams.replay_output import Progress, dump_json

NAME = "best-static"
EXTRA_FRACTIONS = (0.0, 0.125, 0.25, 0.5, 1.0)
COVERAGE_FRACTIONS = (0.0, 0.25, 0.5, 1.0)
GRID_KEYS = {"extra": "extra_candidates", "coverage": "coverage", "budget": "budget_units_per_s"}


@dataclass(frozen=True)
class Grid:
    extra_candidates: tuple[int, ...]
    coverage: tuple[float, ...]
    budget_units_per_s: float

    def points(self) -> list[tuple[int, float]]:
        """Every (extra, coverage) pair, and (0, 0), in order."""
        pairs = {(e, c) for e in self.extra_candidates for c in self.coverage} | {(0, 0.0)}
        return sorted(pairs)

    def as_dict(self) -> dict[str, Any]:
        return {"extra_candidates": list(self.extra_candidates), "coverage": list(self.coverage),
                "budget_units_per_s": self.budget_units_per_s}


def parse_grid(text: str) -> dict[str, Any]:
    """``extra=0,8,16 coverage=0,0.2 [budget=B]`` (any of them) as ``BestStaticConfig`` keys."""
    out: dict[str, Any] = {}
    for part in text.replace(";", " ").split():
        key, sep, values = part.partition("=")
        if not sep or key not in GRID_KEYS or not values:
            raise ValueError(f"--static-grid: expected extra=N,N,... coverage=X,X,... "
                             f"[budget=B], got {part!r}")
        try:
            if key == "extra":
                out[GRID_KEYS[key]] = [int(v) for v in values.split(",") if v]
            elif key == "coverage":
                out[GRID_KEYS[key]] = [float(v) for v in values.split(",") if v]
            else:
                out[GRID_KEYS[key]] = float(values)
        except ValueError:
            raise ValueError(f"--static-grid: {key}= takes numbers, got {values!r}") from None
    return out


def resolve_grid(sc: Scenario, overrides: Mapping[str, Any] | None = None) -> Grid:
    """The scenario's grid with ``overrides`` applied; empty axes take their defaults (the
    coverage axis is just 0 where no pool serves the powerful model: it would change nothing)."""
    cfg = sc.controllers.best_static
    if overrides:
        raw = msgspec.to_builtins(cfg) | dict(overrides)
        try:
            cfg = msgspec.convert(raw, BestStaticConfig, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(f"best-static grid: {exc}") from None
    extra = cfg.extra_candidates or [round(f * sc.control.rma.max_extra_candidates)
                                     for f in EXTRA_FRACTIONS]
    powerful = any(p.model == "powerful" for r in sc.regions for p in r.pools)
    coverage = cfg.coverage or [round(f * sc.control.sbm.max_coverage, 6)
                                for f in (COVERAGE_FRACTIONS if powerful else (0.0,))]
    return Grid(tuple(sorted(set(extra))), tuple(sorted(set(coverage))),
                cfg.budget_units_per_s)


def qualifies(run: Mapping[str, Any]) -> bool:
    """No baseline SLA-violation window and no rejected baseline request."""
    return (run["baseline_sla_violation_windows"] == 0
            and run["baseline_requests_rejected"] == 0)


def choose_best(sweep: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The qualifying entry with the most ``incremental_value`` (ties: fewer
    ``extra_candidates``, then less ``coverage``); without one, the (0, 0) entry."""
    ok = [run for run in sweep if qualifies(run)]
    if ok:
        return min(ok, key=lambda r: (-r["incremental_value"], r["extra_candidates"],
                                      r["coverage"]))
    zero = [r for r in sweep if r["extra_candidates"] == 0 and r["coverage"] == 0.0]
    if not zero:
        raise ValueError("no sweep run qualifies and the sweep has no (0, 0) point")
    return zero[0]


def ratio(value: float, best: float) -> float | None:
    """``value_vs_best_static``: ``value / best``, ``None`` when ``best`` is 0."""
    return round(value / best, 6) if best > 0 else None


def point_dir(extra: int, coverage: float) -> str:
    return f"extra{extra}_coverage{coverage:g}"


def _run_point(sc: Scenario, base: Path, fixed: StaticConfig, out: Path) -> dict[str, Any]:
    from sim.run import run_loaded

    controllers = msgspec.structs.replace(sc.controllers, static=fixed)
    return run_loaded(msgspec.structs.replace(sc, controllers=controllers), base, "static", out)


SWEEP_KEYS = ("baseline_sla_violation_windows", "baseline_requests_rejected",
              "incremental_value", "optional_units_done", "opportunistic_utilization")


def sweep(sc: Scenario, base: Path, out: Path, grid: Grid, *, jobs: int = 2,
          progress: bool = False) -> dict[str, Any]:
    """Run the grid into ``out/sweep/<point>/``, put the chosen run's files in ``out`` and
    return its summary, with the grid, the sweep table and the choice under ``best_static``."""
    points = grid.points()
    settings = {p: StaticConfig(extra_candidates=p[0], coverage=p[1],
                                budget_units_per_s=grid.budget_units_per_s) for p in points}
    dirs = {p: out / "sweep" / point_dir(*p) for p in points}
    meter = Progress(f"{NAME} {sc.name}", enabled=progress)
    results: dict[tuple[int, float], dict[str, Any]] = {}

    def record(p: tuple[int, float], summary: dict[str, Any]) -> None:
        results[p] = summary
        safe = [_row(q, results[q]) for q in sorted(results) if qualifies(results[q])]
        best = f"best safe so far: {_describe(choose_best(safe))}" if safe else "none safe yet"
        meter.update(f"{len(results)}/{len(points)} static runs; {best}", force=True)

    meter.update(f"0/{len(points)} static runs", force=True)
    calls = {p: (_run_point, (sc, base, settings[p], dirs[p])) for p in points}
    for p, summary in pool.each(calls, jobs):
        record(p, summary)
    table = [_row(p, results[p]) for p in points]
    chosen = choose_best(table)
    point = (chosen["extra_candidates"], chosen["coverage"])
    meter.done(f"{len(points)} static runs; chosen {_describe(chosen)}"
               + ("" if qualifies(chosen) else " (no run was safe)"))
    summary = dict(results[point])
    for name in ("timeline.csv", summary["log"]):
        shutil.copyfile(dirs[point] / name, out / name)
    summary["controller"] = NAME
    summary["static_setting"] = msgspec.to_builtins(settings[point])
    summary["best_static"] = {
        "grid": grid.as_dict(), "chosen": dict(chosen), "qualifying": qualifies(chosen),
        "sweep": table, "sweep_dir": "sweep"}
    (out / "summary.json").write_text(dump_json(summary), encoding="utf-8")
    return summary


def _describe(run: Mapping[str, Any]) -> str:
    return (f"extra={run['extra_candidates']} coverage={run['coverage']:g} "
            f"value={run['incremental_value']:g}")


def _row(p: tuple[int, float], summary: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"extra_candidates": p[0], "coverage": p[1]}
    row.update({key: summary[key] for key in SWEEP_KEYS})
    row["qualifies"] = qualifies(summary)
    return row
