"""Running scenarios: one controller into a directory, or several side by side.

``simulate`` writes ``events.jsonl.zst`` (the event log the fleet produced: replay it with
``surplus replay``), ``timeline.csv`` (one row per region and SLA window) and ``summary.json``.
``compare`` runs several controllers on the same scenario (same seed, so the same requests)
into one subdirectory each, and adds a table (``summary.json``), plots (PNG) and
``report.html``; ``best-static`` (``sim.best_static``) is the static controller swept over a
grid, the best safe run kept, and adds ``value_vs_best_static`` to the other rows; ``oracle``
(``sim.oracle``) picks the best safe setting of that sweep window by window, in hindsight, and
adds ``value_vs_oracle``. Result files
never hold wall-clock times: the same scenario, seed and controller give byte-identical files.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sim import best_static, oracle, pool
from sim.controllers import ALIASES, CONTROLLERS
from sim.metrics import read_timeline
from sim.sampling import make_simulation
from sim.scenario import Scenario, find_scenario, load_scenario
from streams.replay_output import dump_json

HEADLINE = ("windows", "baseline_sla_violation_windows", "baseline_requests_rejected",
            "opportunistic_utilization", "incremental_value", "optional_units_shed_total",
            "max_notice_to_shed_ms", "optional_units_done", "e2e_p99_ms",
            "overload_shed_share", "overload_shed_share_steady")


def simulate(scenario: str | Path, controller: str, out_dir: str | Path, *,
             duration_s: float | None = None, seed: int | None = None,
             progress: bool = False, static_grid: Mapping[str, Any] | None = None,
             jobs: int = 2) -> dict[str, Any]:
    """Run ``scenario`` (a path or a shipped name) under ``controller``; returns the summary.
    ``best-static`` runs the whole sweep (see ``sim.best_static``)."""
    path = find_scenario(str(scenario))
    sc, base = load_scenario(path, duration_s=duration_s, seed=seed)
    if controller == best_static.NAME:
        return best_static.sweep(sc, base, Path(out_dir),
                                 best_static.resolve_grid(sc, static_grid), jobs=jobs,
                                 progress=progress)
    return run_loaded(sc, base, controller, Path(out_dir), progress=progress)


def run_loaded(sc: Scenario, base: Path, controller: str, out: Path, *,
               progress: bool = False) -> dict[str, Any]:
    """One controller over an already loaded scenario (a comparison loads it once), its
    ``summary.json`` written to ``out``."""
    name = ALIASES.get(controller, controller)
    if name not in CONTROLLERS:
        raise ValueError(f"unknown controller {controller!r}; known: {', '.join(CONTROLLERS)}, "
                         f"{best_static.NAME} (alias: pid = surplus)")
    summary = make_simulation(sc, base, name, out, progress=progress).run()
    wall = summary.pop("_wall_s")
    if progress:
        sys.stderr.write(f"{sc.name} [{name}]: {sc.duration_s:,.0f} s simulated in "
                         f"{wall:.1f} s\n")
    (out / "summary.json").write_text(dump_json(summary), encoding="utf-8")
    return summary


def compare(scenario: str | Path, controllers: Sequence[str], out_dir: str | Path, *,
            duration_s: float | None = None, seed: int | None = None,
            progress: bool = False, static_grid: Mapping[str, Any] | None = None,
            jobs: int = 2) -> dict[str, Any]:
    """Run each controller on the same scenario; write the side-by-side report.

    ``best-static`` sweeps ``static`` over a grid (the scenario's, with ``static_grid``
    overrides; ``jobs`` processes) and adds ``value_vs_best_static`` to the other rows."""
    path = find_scenario(str(scenario))
    sc, base = load_scenario(path, duration_s=duration_s, seed=seed)
    names = [ALIASES.get(c, c) for c in controllers]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"controllers to compare must be distinct and non-empty: {controllers}")
    hindsight = {best_static.NAME, oracle.NAME}
    unknown = [n for n in names if n not in CONTROLLERS and n not in hindsight]
    if unknown:
        raise ValueError(f"unknown controller {unknown[0]!r}; known: {', '.join(CONTROLLERS)}, "
                         f"{best_static.NAME}, {oracle.NAME} (alias: pid = surplus)")
    swept = hindsight & set(names)
    grid = best_static.resolve_grid(sc, static_grid) if swept else None
    out = Path(out_dir)
    singles = [name for name in names if name not in hindsight]
    runs = _run_controllers(sc, base, singles, out, jobs=jobs, progress=progress)
    if grid is not None:
        # the oracle chooses among the sweep's runs window by window (sim.oracle)
        best = best_static.sweep(sc, base, out / best_static.NAME, grid, jobs=jobs,
                                 progress=progress)
        if best_static.NAME in names:
            runs[best_static.NAME] = best
        if oracle.NAME in names:
            sweep_dir = out / best_static.NAME / "sweep"
            runs[oracle.NAME] = oracle.stitch(
                {p: sweep_dir / best_static.point_dir(*p) for p in grid.points()},
                out / oracle.NAME)
    runs = {name: runs[name] for name in names}
    table = {name: {key: runs[name][key] for key in HEADLINE} for name in names}
    summary = {"scenario": sc.name, "seed": sc.seed, "duration_s": sc.duration_s,
               "controllers": names, "table": table, "runs": runs}
    if oracle.NAME in names:
        bound = runs[oracle.NAME]["incremental_value"]
        vs_oracle = {name: oracle.ratio(runs[name]["incremental_value"], bound)
                     for name in names if name != oracle.NAME}
        for name, value in vs_oracle.items():
            table[name]["value_vs_oracle"] = value
        summary["value_vs_oracle"] = vs_oracle
        summary["oracle"] = runs[oracle.NAME]["oracle"]
    if best_static.NAME in names:
        best = runs[best_static.NAME]
        table[best_static.NAME]["static_setting"] = best["static_setting"]
        vs = {name: best_static.ratio(runs[name]["incremental_value"],
                                      best["incremental_value"])
              for name in names if name != best_static.NAME}
        for name, value in vs.items():
            table[name]["value_vs_best_static"] = value
        summary["value_vs_best_static"] = vs
        summary["best_static"] = best["best_static"]
    (out / "summary.json").write_text(dump_json(summary), encoding="utf-8")
    write_report(out, sc, names, table,
                 grid=grid if best_static.NAME in names else None)
    return summary


def write_report(out: Path, sc: Scenario, names: Sequence[str],
                 table: dict[str, dict[str, Any]], *,
                 grid: best_static.Grid | None = None) -> Path:
    """Plots per region (p99 vs SLA, targets, coverage, capacity, value) and report.html."""
    from streams.replay_report import bar_plot, html_page, line_plot

    rows = {name: read_timeline(out / name / "timeline.csv") for name in names}
    images: list[str] = []
    for region in sc.regions:
        sla = region.sla_p99_ms or sc.control.rma.sla_p99_ms

        def series(column: str, region: str = region.name,
                   cumulative: bool = False) -> dict[str, tuple[list[float], list[float]]]:
            out_series = {}
            for name in names:
                xs, ys, total = [], [], 0.0
                for row in rows[name]:
                    if row["region"] != region:
                        continue
                    value = float(row[column] or 0.0)
                    total += value
                    xs.append(float(row["t_s"]))
                    ys.append(total if cumulative else value)
                out_series[name] = (xs, ys)
            return out_series

        plots = [
            ("ranking_p99", "ranking p99 per window (ms)", series("ranking_p99_ms"), sla),
            ("extra_candidates", "extra candidates target", series("extra_candidates_target"),
             None),
            ("powerful_share", "share of requests served by the powerful model",
             series("powerful_share"), None),
            ("opportunistic_replicas", "opportunistic replicas lent",
             series("opportunistic_replicas"), None),
            ("incremental_value", "cumulative incremental value",
             series("incremental_value", cumulative=True), None),
        ]
        for key, title, data, hline in plots:
            file = f"{region.name}_{key}.png"
            line_plot(out / file, f"{region.name}: {title}", title, data, hline=hline)
            images.append(file)
    bar_plot(out / "incremental_value.png", "incremental value",
             {n: float(table[n]["incremental_value"]) for n in names}, "value")
    bar_plot(out / "sla_violations.png", "baseline SLA violation windows",
             {n: float(table[n]["baseline_sla_violation_windows"]) for n in names}, "windows")
    images[:0] = ["incremental_value.png", "sla_violations.png"]
    notes = [sc.description] if sc.description else []
    if grid is not None:
        setting = table[best_static.NAME]["static_setting"]
        notes.append(
            f"{best_static.NAME}: static targets swept over extra candidates "
            f"{list(grid.extra_candidates)} x coverage {list(grid.coverage)} (and 0, 0); the "
            f"most valuable run with no baseline SLA-violation window and no rejected baseline "
            f"request was extra_candidates={setting['extra_candidates']}, "
            f"coverage={setting['coverage']:g} (runs in {best_static.NAME}/sweep/). "
            f"value_vs_best_static: a controller's incremental value over {best_static.NAME}'s "
            f"(empty when that is 0).")
    if oracle.NAME in names:
        notes.append(
            f"{oracle.NAME}: for each SLA window, the static setting of the sweep that earned "
            f"most in that window with no baseline SLA violation and no rejected baseline "
            f"request, chosen in hindsight (windows taken as independent; see sim/oracle.py). "
            f"value_vs_oracle: a controller's incremental value over the oracle's.")
    if any(r.arrivals.kind == "trace" and r.arrivals.path and "Azure" in r.arrivals.path
           for r in sc.regions):
        from sim.traces import AZURE_ATTRIBUTION

        notes.append(f"Arrivals: {AZURE_ATTRIBUTION}.")
    return html_page(out / "report.html", f"Scenario {sc.name}: {', '.join(names)} "
                     f"(seed {sc.seed}, {sc.duration_s:,.0f} s)", table, images, notes)



def _run_controllers(sc: Scenario, base: Path, names: Sequence[str], out: Path, *, jobs: int,
                     progress: bool) -> dict[str, dict[str, Any]]:
    """Each controller's run, ``jobs`` at a time (`sim.pool`): a simulated day under four
    controllers took 13 minutes one after another on two cores."""
    if jobs <= 1 or len(names) <= 1:
        return {name: run_loaded(sc, base, name, out / name, progress=progress)
                for name in names}
    runs = {}
    calls = {name: (run_loaded, (sc, base, name, out / name)) for name in names}
    for name, summary in pool.each(calls, jobs):
        runs[name] = summary
        if progress:
            sys.stderr.write(f"{sc.name} [{name}]: {sc.duration_s:,.0f} s simulated\n")
    return runs
