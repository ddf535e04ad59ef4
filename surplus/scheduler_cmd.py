"""`surplus scheduler`: lend and reclaim opportunistic capacity on a scenario's timeline."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from surplus.cli_common import (
    Bootstrap,
    MetricsHost,
    MetricsPort,
    Prefix,
    SigningKeyFile,
    fail,
    kafka_settings,
    signing_keys,
)


def scheduler(
    scenario: Annotated[str, typer.Option(
        help="Scenario TOML, or the name of one in sim/scenarios.")] = "demo",
    duration: Annotated[float | None, typer.Option(
        help="Stretch the scenario's timeline to this many seconds (default: as written).")]
    = None,
    start_at_ms: Annotated[int | None, typer.Option(
        help="Wall-clock ms the timeline starts at (default: now).")] = None,
    metrics_port: MetricsPort = 0,
    metrics_host: MetricsHost = "127.0.0.1",
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the schedule and exit; nothing is sent.")] = False,
    direct: Annotated[bool, typer.Option(
        "--direct/--kafka-only",
        help="Also post each notice to the replicas it reclaims (their /v1/preempt, at the "
             "endpoints the replicas topic announces), as a platform calls a pod's preStop "
             "hook; Kafka still carries it to the fleet.")] = True,
    signing_key_file: SigningKeyFile = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
) -> None:
    """Lend and reclaim opportunistic capacity on a scenario's timeline.

    Sends CapacityEvent grants, renewals and revokes and PreemptionNotices (storms included)
    in real time until the timeline ends or SIGTERM / Ctrl-C, then revokes what is still lent.
    """
    from schemas.clock import wall_ms
    from sim import schedule
    from sim.scenario import ScenarioError
    from surplus.live import plan
    from surplus.live.scheduler import ReplicaDirectory, Scheduler

    try:
        scn, base = plan.load(scenario, duration)
        actions = schedule.build(scn, base)
    except ScenarioError as exc:
        fail(str(exc))
    if dry_run:
        for a in actions:
            typer.echo(f"{a.at_ms / 1000:8.2f}s {a.kind:6} {a.pool_id} replicas={a.replicas}")
        return
    settings = kafka_settings(bootstrap, prefix)
    keys = signing_keys(signing_key_file)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    start = start_at_ms if start_at_ms is not None else wall_ms()
    typer.echo(f"scheduler: {len(actions)} actions over {scn.duration_s:.0f}s for "
               f"{', '.join(r.name for r in scn.regions)} on {settings.bootstrap}")
    directory = ReplicaDirectory(settings) if direct else None
    try:
        runner = Scheduler(actions, settings, start,
                           say=lambda line: typer.echo(line), metrics_port=metrics_port,
                           metrics_host=metrics_host, directory=directory, keys=keys)
    except OSError as exc:
        fail(f"cannot serve metrics on port {metrics_port}: {exc}")
    if directory is not None:
        directory.start()
    try:
        stats = runner.run(stop, end_ms=scn.duration_ms)
    finally:
        if directory is not None:
            directory.stop()
    sent = ", ".join(f"{k} {v}" for k, v in sorted(stats.sent.items()))
    posted = ", ".join(f"{k} {v}" for k, v in stats.direct.items())
    typer.echo(f"scheduler stopped after {(wall_ms() - start) / 1000:.1f}s: sent {sent or 'none'}"
               f", {stats.failed} undelivered"
               + (f"; notices posted to replicas: {posted}" if posted else ""))
    if stats.failed:
        fail(f"{stats.failed} messages not delivered: {stats.first_error}")
