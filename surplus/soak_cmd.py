"""`surplus soak`: the demo's system under steady load for a long while; did anything grow?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surplus.cli_common import fail
from surplus.demo_cmd import Cluster, Rate, RunPrefix, ScenarioName


def soak(
    minutes: Annotated[float, typer.Option(
        help="Minutes of load (start-up and shutdown come on top).")] = 30.0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/soak"),
    warmup: Annotated[float | None, typer.Option(
        help="Seconds of load before the start is read (default: a fifth of the run, "
             "1 to 5 minutes).")] = None,
    every: Annotated[float, typer.Option(help="Seconds between samples.")] = 5.0,
    bound: Annotated[float, typer.Option(
        help="Growth allowed after the warm-up, as a share (0.10: 10%).")] = 0.10,
    scenario: ScenarioName = "soak",
    rate: Rate = None,
    bootstrap: Cluster = None,
    prefix: RunPrefix = None,
    report_only: Annotated[bool, typer.Option(
        "--report", help="Only judge the samples of the run in --out again (summary.json, "
                         "soak.txt).")] = False,
) -> None:
    """Run the demo's processes under steady load and check that none of them grows.

    Samples every process (broker, control plane, each worker, scheduler, load generator,
    recorder) for RSS, open fds and threads, and the control plane's and workers' consumer
    lag and targets age; writes summary.json, soak.txt and samples.jsonl to --out (the demo's
    own report in --out/demo) and exits 1 naming the process and measure that grew more than
    --bound after the warm-up.
    """
    from surplus.soak import verdict
    from surplus.soak.run import Soak, SoakOptions

    if report_only:
        try:
            summary = verdict.rejudge(out)
        except (OSError, ValueError, KeyError) as exc:
            fail(f"no soak to judge in {out} ({type(exc).__name__}: {exc})")
        verdict.write(out, summary, typer.echo)
        if not summary["ok"]:
            raise typer.Exit(1)
        return
    seconds = minutes * 60.0
    if seconds < 60:
        fail(f"--minutes must be at least 1, got {minutes:g}")
    if warmup is not None and not 0 <= warmup < seconds:
        fail(f"--warmup must be within the run (0 to {seconds:g} s), got {warmup:g}")
    if every <= 0 or bound <= 0 or (rate is not None and rate <= 0):
        fail("--every, --bound and --rate must be > 0")
    options = SoakOptions(out=out, minutes=minutes, warmup_s=warmup, interval_s=every,
                          bound=bound, scenario=scenario, bootstrap=bootstrap, prefix=prefix,
                          rate=rate)
    code = Soak(options, say=lambda line: typer.echo(line)).run()
    if code:
        raise typer.Exit(code)
