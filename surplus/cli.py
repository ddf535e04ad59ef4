"""`surplus`: one console script whose subcommands wire the pieces together.

Every command exits non-zero with a one-line reason on failure; nothing here holds policy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from surplus import localkafka
from surplus.bench_cmd import bench
from surplus.cli_common import Bootstrap, Prefix, fail, kafka_settings
from surplus.control_cmd import control_plane
from surplus.demo_cmd import demo
from surplus.loadgen_cmd import loadgen
from surplus.record_cmd import record
from surplus.replay_cmd import replay
from surplus.scheduler_cmd import scheduler
from surplus.simulate_cmd import simulate
from surplus.worker_cmd import worker

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Surplus: harvest spare inference capacity for optional ranking work.")
kafka_app = typer.Typer(no_args_is_help=True, help="The embedded local Kafka broker (KRaft).")
topics_app = typer.Typer(no_args_is_help=True, help="The topic catalog on a cluster.")
app.add_typer(kafka_app, name="kafka")
app.add_typer(topics_app, name="topics")
app.command("control-plane")(control_plane)
app.command("worker")(worker)
app.command("record")(record)
app.command("replay")(replay)
app.command("scheduler")(scheduler)
app.command("loadgen")(loadgen)
app.command("demo")(demo)
app.command("bench")(bench)
app.command("simulate")(simulate)

DataDir = Annotated[Path, typer.Option("--data-dir", help="Broker state and logs.")]


@kafka_app.command("fetch")
def kafka_fetch() -> None:
    """Resolve the Kafka broker jars from Maven Central into .kafka/libs."""
    try:
        path = localkafka.fetch_jars()
    except localkafka.BrokerError as exc:
        fail(str(exc))
    typer.echo(f"Kafka jars in {path}")


@kafka_app.command("up")
def kafka_up(port: Annotated[int, typer.Option(help="Client port (controller uses port+1).")]
             = localkafka.DEFAULT_PORT,
             data_dir: DataDir = localkafka.DEFAULT_DATA,
             fetch: Annotated[bool, typer.Option(help="Fetch missing jars first.")] = True) -> None:
    """Start the local broker in the background and wait until it serves metadata."""
    try:
        if fetch:
            localkafka.fetch_jars()
        info, started = localkafka.up(port=port, data_dir=data_dir)
    except localkafka.BrokerError as exc:
        fail(str(exc))
    if started:
        typer.echo(f"Kafka up at {info.bootstrap} (pid {info.pid}, "
                   f"ready in {info.started_in_s:.1f}s, data {info.data_dir})")
    else:
        typer.echo(f"Kafka already running at {info.bootstrap} (pid {info.pid}); nothing to do")
    typer.echo(info.bootstrap)


@kafka_app.command("status")
def kafka_status(data_dir: DataDir = localkafka.DEFAULT_DATA) -> None:
    """Say whether the local broker runs and serves metadata; exit 1 when it does not."""
    info = localkafka.status(data_dir.resolve())
    if info is None:
        typer.echo("Kafka is not running")
        raise typer.Exit(1)
    serving = localkafka.serves_metadata(info.bootstrap)
    typer.echo(f"Kafka running at {info.bootstrap} (pid {info.pid}, "
               f"rss {localkafka.rss_mb(info.pid):.0f} MiB, "
               f"{'serving metadata' if serving else 'NOT serving metadata'})")
    if not serving:
        raise typer.Exit(1)


@kafka_app.command("down")
def kafka_down(data_dir: DataDir = localkafka.DEFAULT_DATA) -> None:
    """Stop the local broker (SIGTERM, then SIGKILL after 30 s)."""
    info = localkafka.down(data_dir)
    typer.echo(f"Kafka stopped (pid {info.pid})" if info else "Kafka was not running")


@topics_app.command("apply")
def topics_apply(bootstrap: Bootstrap = None, prefix: Prefix = None,
                 partitions: Annotated[int | None, typer.Option(
                     help="Override every topic's partition count.")] = None) -> None:
    """Create missing topics from the catalog; exit 1 if existing ones disagree."""
    from surplus.topics import apply_topics

    settings = kafka_settings(bootstrap, prefix)
    try:
        report = apply_topics(settings.confluent(), settings.prefix, partitions)
    except Exception as exc:
        fail(f"could not apply topics on {settings.bootstrap}: {exc}")
    for name in report.created:
        typer.echo(f"created  {name}")
    for name in report.existing:
        typer.echo(f"exists   {name}")
    for problem in report.mismatches:
        typer.echo(f"MISMATCH {problem}", err=True)
    if not report.ok:
        raise typer.Exit(1)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
