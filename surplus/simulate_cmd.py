"""`surplus simulate SCENARIO`: the closed-loop fleet simulator, one controller or several."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from surplus.cli_common import fail


def simulate(
    scenario: Annotated[str, typer.Argument(
        help="Scenario TOML, or the name of a shipped one (sim/scenarios).")],
    out: Annotated[Path, typer.Option(
        help="Output directory: events.jsonl.zst, timeline.csv, summary.json.")],
    controller: Annotated[str, typer.Option(
        help="surplus (alias pid), static, greedy, naive, off, or best-static (static swept "
             "over a grid, the best safe run kept).")] = "surplus",
    compare: Annotated[str | None, typer.Option(
        help="Comma-separated controllers to run side by side, e.g. "
             "surplus,naive,static,greedy,best-static,oracle (writes a table, plots and "
             "report.html; with best-static, value_vs_best_static; with oracle, the best "
             "safe setting per window in hindsight, value_vs_oracle).")] = None,
    static_grid: Annotated[str | None, typer.Option(
        help="best-static's grid, e.g. 'extra=0,8,16,32 coverage=0,0.1,0.2' [budget=B] "
             "(default: the scenario's [controllers.best_static]).")] = None,
    jobs: Annotated[int, typer.Option(
        help="Processes for the compared controllers and best-static's sweep (results do "
             "not depend on it).", min=1)] = 2,
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed.")] = None,
    duration: Annotated[float | None, typer.Option(
        help="Override the scenario's duration (seconds).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress line.")] = False,
) -> None:
    """Simulate a fleet under a controller; --compare runs several on the same requests."""
    from sim.best_static import parse_grid
    from sim.run import HEADLINE
    from sim.run import compare as run_compare
    from sim.run import simulate as run_one
    from sim.scenario import ScenarioError

    if duration is not None and duration <= 0:
        fail(f"--duration must be > 0, got {duration}")
    try:
        grid = parse_grid(static_grid) if static_grid else None
        if compare:
            names = [c.strip() for c in compare.split(",") if c.strip()]
            summary = run_compare(scenario, names, out, duration_s=duration, seed=seed,
                                  progress=not quiet, static_grid=grid, jobs=jobs)
            width = max(len(name) for name in summary["controllers"])
            for name in summary["controllers"]:
                row = summary["table"][name]
                extra = [k for k in ("value_vs_best_static", "value_vs_oracle", "static_setting")
                         if k in row]
                typer.echo(f"{name:{width}s} " + ", ".join(
                    f"{k}={row[k]}" for k in (*HEADLINE[:5], *extra)))
            for region, levers in summary["runs"].get("surplus", {}).get("lift", {}).items():
                typer.echo(_lift_line(region, levers))
            typer.echo(f"report: {out / 'report.html'}")
            return
        result = run_one(scenario, controller, out, duration_s=duration, seed=seed,
                         progress=not quiet, static_grid=grid, jobs=jobs)
    except (ScenarioError, ValueError, OSError) as exc:
        fail(str(exc))
    typer.echo(", ".join(f"{k}={result[k]}" for k in HEADLINE))
    if "static_setting" in result:
        typer.echo(f"static_setting={result['static_setting']}")
    for region, levers in result.get("lift", {}).items():
        typer.echo(_lift_line(region, levers))
    typer.echo(f"summary: {out / 'summary.json'}; event log: {out / result['log']}")


def _lift_line(region: str, levers: dict[str, Any]) -> str:
    """Measured lift (the control plane's, against the holdout) beside the true lift."""
    parts = []
    for lever in ("all", "sbm", "rma", "precompute"):
        if lever == "precompute" and lever not in levers:
            continue   # the lever was off
        e = levers.get(lever) or {}
        if e.get("lift_measured") is None:
            parts.append(f"{lever} not measured (true {e.get('lift_true')})")
            continue
        parts.append(f"{lever} {e['lift_measured']:.4f} [{e['lift_ci_low']:.4f}, "
                     f"{e['lift_ci_high']:.4f}] true {e['lift_true']:.4f}")
    return f"lift per treated request, {region}: " + "; ".join(parts)
