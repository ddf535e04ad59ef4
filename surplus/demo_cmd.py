"""`surplus demo`: run the whole system on this machine for a while, then report what it gained."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surplus.cli_common import fail

ScenarioName = Annotated[str, typer.Option(
    help="Scenario TOML, or the name of one in sim/scenarios.")]
Rate = Annotated[float | None, typer.Option(help="Mean requests/s (default: the scenario's).")]
Cluster = Annotated[str | None, typer.Option(
    "--bootstrap", "-b", help="An existing cluster (default: $KAFKA_BOOTSTRAP_SERVERS, "
                              "else an embedded broker for the run).")]
RunPrefix = Annotated[str | None, typer.Option(help="Topic prefix (default: surplus.demo.).")]


def demo(
    duration: Annotated[float, typer.Option(
        help="Seconds of load (start-up and shutdown come on top).")] = 180.0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/demo"),
    prometheus: Annotated[bool, typer.Option(
        "--prometheus", help="Also run a `prometheus` binary (if installed) on the endpoints.")]
    = False,
    scenario: ScenarioName = "demo",
    rate: Rate = None,
    bootstrap: Cluster = None,
    prefix: RunPrefix = None,
    background_nice: Annotated[int, typer.Option(
        min=0, max=19, help="Niceness added to the control plane, the recorder and "
                            "Prometheus, which share the cores with the serving path "
                            "(0: none).")] = 10,
    provisioned_nice: Annotated[int, typer.Option(
        min=-20, max=0, help="Niceness of the provisioned replicas, which stand for the "
                             "fleet's own hardware on shared cores (negative needs root; "
                             "elsewhere they run at 0).")] = -5,
    opportunistic_nice: Annotated[int, typer.Option(
        min=0, max=19, help="Niceness added to the opportunistic replicas, so that on "
                            "shared cores their optional work yields the CPU to the "
                            "provisioned replicas' baseline work (0: none).")] = 5,
    cores_per_unit: Annotated[float, typer.Option(
        min=0.01, max=64.0, help="CPU cores one lent unit is: each opportunistic replica runs "
                                 "in a cgroup CPU quota of its grant's size (root only; "
                                 "elsewhere the run says it has no slices).")] = 0.5,
    slices: Annotated[bool, typer.Option(
        "--slices/--no-slices", help="Run opportunistic replicas in CPU slices (cgroups) "
                                     "where the host allows it.")] = True,
    report_only: Annotated[bool, typer.Option(
        "--report", help="Only rebuild summary.json, plots and report.html from --out.")]
    = False,
) -> None:
    """Run the whole system on this machine for a while, then report what it gained.

    Starts Kafka (unless given), the control plane, baseline and opportunistic workers, the
    capacity scheduler (with a preemption storm) and the load generator; shows progress; stops
    everything; writes summary.json, report.html with plots and the event log to --out.
    """
    from surplus.demo import report
    from surplus.demo.options import DemoOptions
    from surplus.demo.run import Demo
    from surplus.demo.runinfo import verdict

    if report_only:
        if not (out / "run.json").is_file():
            fail(f"no run in {out} (run.json missing)")
        typer.echo(verdict(report.build(out)))
        typer.echo(f"report: {out / 'report.html'}")
        return
    if duration < 20:
        fail(f"--duration must be at least 20 s (a few control periods), got {duration:g}")
    if rate is not None and rate <= 0:
        fail(f"--rate must be > 0, got {rate:g}")
    options = DemoOptions(out=out, duration_s=duration, scenario=scenario, bootstrap=bootstrap,
                          prefix=prefix, prometheus=prometheus, rate=rate,
                          background_nice=background_nice,
                          provisioned_nice=provisioned_nice,
                          opportunistic_nice=opportunistic_nice,
                          cores_per_unit=cores_per_unit, slices=slices)
    code = Demo(options, say=lambda line: typer.echo(line)).run()
    if code:
        raise typer.Exit(code)
