"""`surplus simulate SCENARIO`: the closed-loop fleet simulator, one controller or several."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surplus.cli_common import fail


def simulate(
    scenario: Annotated[str, typer.Argument(
        help="Scenario TOML, or the name of a shipped one (sim/scenarios).")],
    out: Annotated[Path, typer.Option(
        help="Output directory: events.jsonl.zst, timeline.csv, summary.json.")],
    controller: Annotated[str, typer.Option(
        help="surplus (alias pid), static, greedy, naive or off.")] = "surplus",
    compare: Annotated[str | None, typer.Option(
        help="Comma-separated controllers to run side by side, e.g. "
             "surplus,naive,static,greedy (writes a table, plots and report.html).")] = None,
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed.")] = None,
    duration: Annotated[float | None, typer.Option(
        help="Override the scenario's duration (seconds).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress line.")] = False,
) -> None:
    """Simulate a fleet under a controller; --compare runs several on the same requests."""
    from sim.run import HEADLINE
    from sim.run import compare as run_compare
    from sim.run import simulate as run_one
    from sim.scenario import ScenarioError

    if duration is not None and duration <= 0:
        fail(f"--duration must be > 0, got {duration}")
    try:
        if compare:
            names = [c.strip() for c in compare.split(",") if c.strip()]
            summary = run_compare(scenario, names, out, duration_s=duration, seed=seed,
                                  progress=not quiet)
            for name in summary["controllers"]:
                row = summary["table"][name]
                typer.echo(f"{name:8s} " + ", ".join(f"{k}={row[k]}" for k in HEADLINE[:5]))
            typer.echo(f"report: {out / 'report.html'}")
            return
        result = run_one(scenario, controller, out, duration_s=duration, seed=seed,
                         progress=not quiet)
    except (ScenarioError, ValueError, OSError) as exc:
        fail(str(exc))
    typer.echo(", ".join(f"{k}={result[k]}" for k in HEADLINE))
    typer.echo(f"summary: {out / 'summary.json'}; event log: {out / result['log']}")
