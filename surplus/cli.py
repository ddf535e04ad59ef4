"""`surplus`: one console script whose subcommands wire the pieces together.

Every command exits non-zero with a one-line reason on failure; nothing here holds policy.
Every option of every command can also be set in the environment (Click's auto envvars:
`SURPLUS_CONTROL_METRICS_PORT` for `surplus control-plane --metrics-port`,
`SURPLUS_WORKER_PORT` for `surplus worker --port`, `SURPLUS_<COMMAND>_<OPTION>` elsewhere) or
in a settings file (`surplus --settings FILE`, see `surplus.settings_file`); flags win over the
environment, the environment over the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from schemas.build import surplus_version
from surplus import localkafka, logs, settings_file
from surplus.bench_cmd import bench
from surplus.capacity_cmd import capacity_agent
from surplus.chaos_cmd import chaos
from surplus.cli_common import Bootstrap, Prefix, fail, kafka_settings
from surplus.control_cmd import control_plane
from surplus.demo_cmd import demo
from surplus.loadgen_cmd import loadgen
from surplus.override_cmd import override_app
from surplus.record_cmd import record
from surplus.replay_cmd import replay
from surplus.scheduler_cmd import scheduler
from surplus.simulate_cmd import simulate
from surplus.soak_cmd import soak
from surplus.worker_cmd import worker

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  context_settings={"auto_envvar_prefix": "SURPLUS"},
                  help="Surplus: harvest spare inference capacity for optional ranking work.")
kafka_app = typer.Typer(no_args_is_help=True,
                        help="The embedded local Kafka broker, or cluster (KRaft).")
topics_app = typer.Typer(no_args_is_help=True, help="The topic catalog on a cluster.")
app.add_typer(kafka_app, name="kafka")
app.add_typer(topics_app, name="topics")
app.add_typer(override_app, name="override")
# These two keep the prefixes their settings classes have always read (SURPLUS_CONTROL_*,
# SURPLUS_WORKER_*); the other commands get SURPLUS_<COMMAND>_<OPTION>.
app.command("control-plane",
            context_settings={"auto_envvar_prefix": "SURPLUS_CONTROL"})(control_plane)
app.command("worker", context_settings={"auto_envvar_prefix": "SURPLUS_WORKER"})(worker)
app.command("record")(record)
app.command("replay")(replay)
app.command("scheduler")(scheduler)
app.command("capacity-agent")(capacity_agent)
app.command("loadgen")(loadgen)
app.command("demo")(demo)
app.command("bench")(bench)
app.command("simulate")(simulate)
app.command("soak")(soak)
app.command("chaos")(chaos)

DataDir = Annotated[Path, typer.Option("--data-dir", help="Broker state and logs.")]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"surplus {surplus_version()}")
        raise typer.Exit()


@app.callback()
def root(ctx: typer.Context,
         version: Annotated[bool, typer.Option(
             "--version", callback=_print_version, is_eager=True, allow_from_autoenv=False,
             help="Print the installed version and exit.")] = False,
         settings: Annotated[Path | None, typer.Option(
             "--settings", envvar="SURPLUS_SETTINGS", show_envvar=True,
             help="TOML file with a table per command (\\[control-plane], \\[worker], "
                  "\\[kafka.up], ...) of that command's options; flags and the environment "
                  "win over it.")] = None,
         log_format: Annotated[logs.LogFormat, typer.Option(
             envvar=logs.ENV, show_envvar=True,
             help="Log lines as text, or one JSON object per line.")] = "text") -> None:
    """Settings file and log format, for whichever command follows."""
    if settings is not None:
        try:
            ctx.default_map = settings_file.load(settings, typer.main.get_group(app))
        except settings_file.SettingsFileError as exc:
            fail(str(exc))
        source = ctx.get_parameter_source("log_format")
        if source is not None and source.name == "DEFAULT":
            log_format = ctx.default_map.get("log_format", log_format)
    if log_format not in logs.FORMATS:
        fail(f"bad settings file {settings}: log_format {log_format!r}: expected one of "
             f"{', '.join(logs.FORMATS)}")
    logs.select(log_format)
    if log_format == "json":    # a library's warning must not be the one plain line
        logs.configure()


@kafka_app.command("fetch")
def kafka_fetch() -> None:
    """Resolve the Kafka broker jars from Maven Central into .kafka/libs."""
    try:
        path = localkafka.fetch_jars()
    except localkafka.BrokerError as exc:
        fail(str(exc))
    typer.echo(f"Kafka jars in {path}")


@kafka_app.command("up")
def kafka_up(port: Annotated[int, typer.Option(
                 help="Client port (controller uses port+1; with --brokers N, node i uses "
                      "port+2(i-1) and the port after).")] = localkafka.DEFAULT_PORT,
             data_dir: DataDir = localkafka.DEFAULT_DATA,
             brokers: Annotated[int, typer.Option(
                 min=1, max=localkafka.MAX_BROKERS,
                 help="Nodes (broker and controller each); from 3, topics get replication "
                      "factor 3 and min.insync.replicas 2.")] = 1,
             fetch: Annotated[bool, typer.Option(help="Fetch missing jars first.")] = True) -> None:
    """Start the local broker (or cluster) in the background and wait until it serves
    metadata."""
    try:
        if fetch:
            localkafka.fetch_jars()
        if brokers > 1:
            _cluster_up(brokers, port, data_dir)
            return
        info, started = localkafka.up(port=port, data_dir=data_dir)
    except localkafka.BrokerError as exc:
        fail(str(exc))
    if started:
        typer.echo(f"Kafka up at {info.bootstrap} (pid {info.pid}, "
                   f"ready in {info.started_in_s:.1f}s, data {info.data_dir})")
    else:
        typer.echo(f"Kafka already running at {info.bootstrap} (pid {info.pid}); nothing to do")
    typer.echo(info.bootstrap)


def _cluster_up(brokers: int, port: int, data_dir: Path) -> None:
    cluster, started = localkafka.up_cluster(brokers, port=port, data_dir=data_dir)
    pids = ", ".join(f"node {n.node_id} pid {n.pid}" for n in cluster.nodes)
    if started:
        typer.echo(f"Kafka cluster of {brokers} up at {cluster.bootstrap} ({pids}, ready in "
                   f"{cluster.started_in_s:.1f}s, data {cluster.data_dir})")
    else:
        typer.echo(f"Kafka cluster already running at {cluster.bootstrap} ({pids}); "
                   f"nothing to do")
    typer.echo(cluster.bootstrap)


@kafka_app.command("status")
def kafka_status(data_dir: DataDir = localkafka.DEFAULT_DATA) -> None:
    """Say whether the local broker (every node of a cluster) runs and serves metadata; exit 1
    when it does not."""
    if localkafka.is_cluster(data_dir):
        _cluster_status(data_dir)
        return
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


def _cluster_status(data_dir: Path) -> None:
    cluster = localkafka.cluster_status(data_dir)
    if cluster is None:
        typer.echo("Kafka cluster is not running")
        raise typer.Exit(1)
    healthy = not cluster.missing
    for node in cluster.nodes:
        serving = localkafka.serves_metadata(node.bootstrap)
        healthy = healthy and serving
        typer.echo(f"node {node.node_id} running at {node.bootstrap} (pid {node.pid}, "
                   f"rss {localkafka.rss_mb(node.pid):.0f} MiB, "
                   f"{'serving metadata' if serving else 'NOT serving metadata'})")
    for node_id in cluster.missing:
        typer.echo(f"node {node_id} NOT running")
    if not healthy:
        raise typer.Exit(1)


@kafka_app.command("down")
def kafka_down(data_dir: DataDir = localkafka.DEFAULT_DATA) -> None:
    """Stop the local broker, or every node of a cluster (SIGTERM, then SIGKILL after 30 s)."""
    if localkafka.is_cluster(data_dir):
        cluster = localkafka.down_cluster(data_dir)
        typer.echo("Kafka cluster stopped (" + ", ".join(f"node {n.node_id} pid {n.pid}"
                                                         for n in cluster.nodes) + ")"
                   if cluster else "Kafka cluster was not running")
        return
    info = localkafka.down(data_dir)
    typer.echo(f"Kafka stopped (pid {info.pid})" if info else "Kafka was not running")


@topics_app.command("apply")
def topics_apply(bootstrap: Bootstrap = None, prefix: Prefix = None,
                 partitions: Annotated[int | None, typer.Option(
                     help="Override every topic's partition count.")] = None,
                 replication_factor: Annotated[int | None, typer.Option(
                     min=1, help="Replicas per partition of new topics (default: the "
                                 "cluster's broker count, up to 3).")] = None) -> None:
    """Create missing topics from the catalog; exit 1 if existing ones disagree."""
    from surplus.topics import apply_topics

    settings = kafka_settings(bootstrap, prefix)
    try:
        report = apply_topics(settings.confluent(), settings.prefix, partitions,
                              replication_factor=replication_factor)
    except Exception as exc:
        fail(f"could not apply topics on {settings.bootstrap}: {exc}")
    for name in report.created:
        typer.echo(f"created  {name} (replication factor {report.replication_factor})")
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
