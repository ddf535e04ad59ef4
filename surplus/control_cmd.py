"""`surplus control-plane`: run the Faust control plane as a worker process."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

if TYPE_CHECKING:
    from schemas.kafka_config import KafkaSettings
    from streams.control.config import ControlConfig
    from streams.settings import ControlPlaneSettings

from surplus import logs
from surplus.cli_common import (
    Bootstrap,
    MetricsHost,
    MetricsPort,
    Prefix,
    fail,
    kafka_settings,
    preflight,
)


def control_plane(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    config: Annotated[Path | None, typer.Option(help="ControlConfig TOML (control laws).")]
    = None,
    app_id: Annotated[str, typer.Option(help="Consumer group / app id.")] = "surplus-control",
    instance_id: Annotated[str | None, typer.Option(
        help="Stable name of this process: a restart in place takes its partitions back at "
             "once (static membership); a named process that stops for good holds them for "
             "the session timeout.")] = None,
    partitions: Annotated[int | None, typer.Option(help="Partitions of the scope topics.")]
    = None,
    stages: Annotated[int | None, typer.Option(
        help="1: a scope's telemetry is read by the process owning the scope. 2: workers key "
             "reports by replica (telemetry_key = \"replica\") and every process sums the "
             "partitions it owns, the scope's owner merging the parts. Or set "
             "$SURPLUS_CONTROL_STAGES.")] = None,
    metrics_port: MetricsPort = 0,
    metrics_host: MetricsHost = "127.0.0.1",
    data_dir: Annotated[Path, typer.Option(help="Faust local state.")] = Path(".surplus/control"),
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "warning",
    signing_key_file: Annotated[Path | None, typer.Option(
        help="Sign every ControlTargets, and refuse capacity events, notices and overrides "
             "that do not verify, with the keyring in this key file or key directory (a file "
             "per key id, `active` naming the signing one; re-read while it runs). Or set "
             "$SURPLUS_CONTROL_SIGNING_KEY.")] = None,
    print_config: Annotated[bool, typer.Option(
        "--print-config", help="Print the control laws this would run with (every key, then "
        "each [scopes.<region>] override and what it changes) as TOML, and exit.")] = False,
) -> None:
    """Run the control plane (Faust agents) until SIGTERM / Ctrl-C."""
    from streams.control.config import ConfigError, load_config
    from streams.settings import ControlPlaneSettings

    kafka = kafka_settings(bootstrap, prefix)
    overrides: dict[str, Any] = {"app_id": app_id, "metrics_port": metrics_port,
                                 "metrics_host": metrics_host,
                                 "data_dir": data_dir / app_id, "loglevel": loglevel}
    if partitions:
        overrides["partitions"] = partitions
    if stages is not None:
        overrides["stages"] = stages
    if instance_id is not None:
        overrides["instance_id"] = instance_id
    if signing_key_file is not None:
        overrides["signing_key_file"] = signing_key_file
    try:
        settings = ControlPlaneSettings(**overrides)
        control = load_config(config) if config else None
    except ValidationError as exc:
        err = exc.errors()[0]
        fail(f"bad control-plane setting {'.'.join(map(str, err['loc']))}: {err['msg']}")
    except (ConfigError, OSError) as exc:
        fail(f"bad control config {config}: {exc}")
    if print_config:
        typer.echo(describe_config(control), nl=False)
        return
    preflight(kafka, timeout_s=15.0)
    inputs_there = _check_partitions(kafka, settings.partitions)
    settings = settings.model_copy(update={"replication_factor": _replication(kafka, settings)})
    if _create_internal_topics(kafka, settings, control) and inputs_there:
        # Every topic is there: Faust need not declare them, which asks the controller
        # broker and crashes its conductor while that broker is down (`declare_topics`).
        settings = settings.model_copy(update={"declare_topics": False})
    import uvloop
    from faust import Worker

    from schemas.heap import freeze_startup_heap
    from streams.app import create_app

    uvloop.install()  # Faust's per-event cost is event-loop callbacks: uvloop halves it

    app = create_app(kafka, settings, control)
    worker = faust_worker(Worker, app, loglevel)
    # Faust, aiokafka and the app leave ~110,000 objects that a full collection walks for
    # ~70 ms with the GIL held, stalling ticks and the preemption fast path (schemas.heap).
    freeze_startup_heap()
    worker.execute_from_commandline()


def faust_worker(worker_cls: Any, app: Any, loglevel: str) -> Any:
    """Faust's Worker, without its terminal spinner: to make the spinner turn on every log
    line, Faust sets the root logger to DEBUG under a level of WARNING or above, and every
    debug line of aiokafka's fetch loop was then built and handled (7% of the control plane's
    CPU under the demo's load, profiled with py-spy)."""
    worker = worker_cls(app, loglevel=loglevel, quiet=True, **logs.faust_options(loglevel))
    worker.spinner = None
    return worker


def describe_config(control: ControlConfig | None) -> str:
    """The effective control config as TOML that `--config` reads back to the same laws: every
    key (defaults included), then per scope its overrides and, as comments, what they change
    from the keys above."""
    import msgspec

    from streams.control.config import ControlConfig
    from surplus.live.plan import to_toml

    control = control or ControlConfig()
    tree = msgspec.to_builtins(control)
    scopes = tree.pop("scopes")
    text = to_toml(tree)
    base = _flat(tree)
    for scope in sorted(scopes):
        changed = _flat(msgspec.to_builtins(control.for_scope(scope)))
        notes = [f"# {scope}: {key} = {base.get(key)!r} -> {value!r}"
                 for key, value in sorted(changed.items())
                 if key != "scopes" and base.get(key) != value]
        text += "\n" + "\n".join(notes or [f"# {scope}: changes nothing"]) + "\n"
        text += to_toml(scopes[scope], f"scopes.{scope}")
    return text


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _replication(kafka: KafkaSettings, settings: ControlPlaneSettings) -> int:
    """The replication factor of the control plane's own topics: as set, else the cluster's
    (`surplus.topics.cluster_replication`), else 1 with a warning (cluster unreachable)."""
    if settings.replication_factor is not None:
        return settings.replication_factor
    from schemas import kafka_clients
    from surplus.topics import cluster_replication

    try:
        return cluster_replication(kafka_clients.admin(kafka), timeout_s=10.0)
    except Exception as exc:
        typer.echo(f"warning: could not count the cluster's brokers ({exc}); the control "
                   f"plane's topics get 1 replica (set SURPLUS_CONTROL_REPLICATION_FACTOR)",
                   err=True)
        return 1


def _create_internal_topics(kafka: KafkaSettings, settings: ControlPlaneSettings,
                            control: ControlConfig | None) -> bool:
    """Create the ticks and changelog topics (the scopes' and the join's pending decisions')
    before Faust starts. Faust creates them too, but
    its consumer can subscribe before the broker's metadata shows them; the consumer then
    ignores the topic until its next metadata refresh, minutes later, and the process never
    ticks (seen once in the fault suite: no targets for a whole minute)."""
    from schemas import kafka_clients
    from streams.agents.control import internal_topics, partials_topic, pending_topic
    from streams.agents.pending import changelog_config
    from streams.control.config import ControlConfig
    from surplus.topics import create_topics, replicated

    ticks, changelog = internal_topics(kafka, settings)
    control = control or ControlConfig()
    replication = settings.replication_factor or 1
    topics = [(ticks, {"cleanup.policy": "delete"}), (changelog, {"cleanup.policy": "compact"}),
              (pending_topic(kafka, settings), changelog_config(control))]
    if settings.stages == 2:
        topics.append((partials_topic(kafka, settings), {"cleanup.policy": "delete",
                                                         "retention.ms": "3600000"}))
    wanted = [kafka_clients.NewTopic(name, num_partitions=settings.partitions,
                                     replication_factor=replication,
                                     config=replicated(config, replication))
              for name, config in topics]
    try:
        create_topics(kafka_clients.admin(kafka), wanted, timeout_s=15.0)
    except Exception as exc:  # Faust still tries itself; say why this did not
        typer.echo(f"warning: could not create the control plane's topics: {exc}", err=True)
        return False
    return True


def _check_partitions(kafka: Any, partitions: int) -> bool:
    """Co-partitioning is what makes one process own a scope on every topic: refuse to start
    on input topics whose partition count is not `--partitions`; warn about missing ones.
    True when every input topic is there."""
    from schemas import kafka_clients
    from streams.agents.control import INPUTS

    try:
        meta = kafka_clients.admin(kafka).list_topics(timeout=10)
    except Exception:
        return False  # unreachable cluster: preflight already warned
    complete = True
    for logical in INPUTS:
        name = kafka.topic(logical)
        topic = meta.topics.get(name)
        if topic is None or topic.error is not None:
            typer.echo(f"warning: topic {name} is missing (run `surplus topics apply`)", err=True)
            complete = False
        elif len(topic.partitions) != partitions:
            fail(f"topic {name} has {len(topic.partitions)} partitions but --partitions is "
                 f"{partitions}: every input topic must have the same count")
    return complete
