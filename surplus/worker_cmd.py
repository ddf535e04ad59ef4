"""`surplus worker`: run one inference worker (HTTP ranking API, torch model, Kafka I/O)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from surplus import logs
from surplus.cli_common import Bootstrap, Prefix, fail, preflight


def worker(
    config: Annotated[Path | None, typer.Option(help="WorkerConfig TOML; flags override it.")]
    = None,
    pool: Annotated[str | None, typer.Option(
        help="Pool id region/service/model/accelerator/tier, e.g. "
             "eu1/rank/baseline/cpu/opportunistic (sets those five; their own flags win).")]
    = None,
    worker_id: Annotated[str | None, typer.Option(help="Replica id (default: host-pid).")]
    = None,
    region: Annotated[str | None, typer.Option(help="Scope of the targets to apply.")] = None,
    service: Annotated[str | None, typer.Option(help="Service name in the pool id.")] = None,
    tier: Annotated[str | None, typer.Option(help="baseline | opportunistic")] = None,
    accelerator: Annotated[str | None, typer.Option(help="Accelerator type in the pool id.")]
    = None,
    model: Annotated[str | None, typer.Option(help="baseline | powerful")] = None,
    model_path: Annotated[str | None, typer.Option(
        help="A torch.export (.pt2), ONNX (.onnx) or TorchScript file instead of the "
             "reference model.")] = None,
    host: Annotated[str | None, typer.Option(help="HTTP bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (0 picks a free one).")] = None,
    advertise_url: Annotated[str | None, typer.Option(
        help="Base URL clients reach this replica at, announced on the replicas topic "
             "(default: http://HOST:PORT where it listens).")] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    kafka: Annotated[bool | None, typer.Option(
        "--kafka/--no-kafka", help="Use Kafka (default: when a bootstrap is given by flag, "
                                   "config or $SURPLUS_KAFKA_BOOTSTRAP).")] = None,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
    signing_key_file: Annotated[Path | None, typer.Option(
        help="Refuse targets and preemption notices (Kafka and POST /v1/preempt) that do "
             "not verify against the keyring in this key file or key directory, and sign "
             "this replica's own SIGTERM notice; re-read while it runs.")] = None,
    telemetry_key: Annotated[str | None, typer.Option(
        help="scope | replica: key this replica's reports by its region (a control plane "
             "in one stage) or by its id (one run with --stages 2).")] = None,
    precompute: Annotated[bool | None, typer.Option(
        "--precompute/--no-precompute",
        help="On a lent (opportunistic) replica: score jobs from the precompute topic in the "
             "model's idle time, answers to the cache topic (needs Kafka).")] = None,
) -> None:
    """Serve rankings until SIGTERM / Ctrl-C, then finish queued work and exit cleanly."""
    from workers.runtime.config import ConfigError, check_precompute_kafka, load_config
    from workers.runtime.models import ModelLoadError
    from workers.runtime.server import GIL_SWITCH_INTERVAL_S, serve

    logs.configure(loglevel)
    parts = _pool_parts(pool) if pool else {}
    overrides: dict[str, Any] = {
        **parts, **{k: v for k, v in {"region": region, "service": service, "tier": tier,
                                      "accelerator": accelerator, "model.name": model}.items()
                    if v is not None},
        "worker_id": worker_id, "model.path": model_path,
        "host": host, "port": port, "advertise_url": advertise_url,
        "telemetry_key": telemetry_key, "precompute.enabled": precompute,
        "targets_signing_key_file": str(signing_key_file) if signing_key_file else None}
    try:
        settings = load_config(config, overrides,
                               defaults={"worker_id": f"{socket.gethostname()}-{os.getpid()}"})
        settings = _kafka_switch(settings, bootstrap, prefix, kafka)
        check_precompute_kafka(settings)
    except ConfigError as exc:
        fail(str(exc))
    kafka_block = settings.kafka_settings()
    if kafka_block is not None:
        preflight(kafka_block, timeout_s=5.0)

    def ready(w: Any, bound_port: int) -> None:
        typer.echo(f"worker {w.config.worker_id} ready on http://{w.config.host}:{bound_port} "
                   f"(pool {w.config.pool}, model {w.model.source}, "
                   f"kafka {'on' if w.kafka else 'off'})")

    try:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        asyncio.run(serve(settings, on_ready=ready, freeze_heap=True))
    except ModelLoadError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot serve on {settings.host}:{settings.port}: {exc.strerror or exc}")
    typer.echo("worker stopped")


def _pool_parts(pool: str) -> dict[str, str]:
    """The five parts of a pool id, as config overrides; a malformed id stops at start."""
    parts = pool.split("/")
    if len(parts) != 5 or not all(parts):
        fail(f"bad --pool {pool!r}: expected region/service/model/accelerator/tier")
    region, service, model, accelerator, tier = parts
    return {"region": region, "service": service, "model.name": model,
            "accelerator": accelerator, "tier": tier}


def _kafka_switch(settings: Any, bootstrap: str | None, prefix: str | None,
                  kafka: bool | None) -> Any:
    """Kafka on or off, and its flags merged over the config's ``[kafka]`` table."""
    import msgspec

    wants_kafka = kafka if kafka is not None else bool(
        bootstrap or settings.kafka is not None or os.environ.get("SURPLUS_KAFKA_BOOTSTRAP"))
    block = None
    if wants_kafka:
        block = dict(settings.kafka or {})
        block.update({k: v for k, v in {"bootstrap": bootstrap, "prefix": prefix}.items() if v})
    settings = msgspec.structs.replace(settings, kafka=block)
    settings.kafka_settings()  # validate the merged block: a bad key names itself
    return settings
