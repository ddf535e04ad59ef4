"""The command line each process of a demo run is started with.

Every process reaches the same cluster under the run's prefix and signs with the run's key
directory, and a flag one of them misses shows up only as a process that reads nothing or
refuses everything; so the lines are built here, each from the settings it needs, and the run
only starts them.
"""

from __future__ import annotations

from pathlib import Path

from schemas.kafka_config import KafkaSettings
from schemas.topics import SCOPE_PARTITIONS
from surplus.demo.options import APP_ID
from surplus.live import plan


def kafka_args(kafka: KafkaSettings) -> list[str]:
    """The cluster and the run's topic prefix."""
    return ["--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix]


def signing_args(keys: Path) -> list[str]:
    """The run's key directory (``options.signing_dir``)."""
    return ["--signing-key-file", str(keys)]


def recorder(log: Path, since_ms: int, kafka: KafkaSettings) -> list[str]:
    """``surplus record`` from ``since_ms``, so the log holds the run from its first event."""
    return ["record", "--out", str(log), "--from", f"time:{since_ms}", "--quiet",
            *kafka_args(kafka)]


def control_plane(kafka: KafkaSettings, keys: Path, *, config: Path, port: int,
                  data_dir: Path) -> list[str]:
    """The control plane with the demo's application id on every scope partition."""
    return ["control-plane", *kafka_args(kafka), "--config", str(config),
            "--app-id", APP_ID, "--partitions", str(SCOPE_PARTITIONS),
            "--metrics-port", str(port), "--data-dir", str(data_dir),
            "--loglevel", "warning", *signing_args(keys)]


def worker(kafka: KafkaSettings, keys: Path, *, config: Path, replica: plan.Replica,
           port: int, precompute: bool = False) -> list[str]:
    """One inference worker as the scenario describes its replica; ``precompute``: it scores
    the precompute lever's jobs in its idle time (a lent replica of the jobs' model)."""
    r = replica
    return ["worker", "--config", str(config), "--worker-id", r.worker_id,
            "--region", r.region, "--service", r.service, "--tier", r.tier,
            "--accelerator", r.accelerator, "--model", r.model,
            "--port", str(port), *kafka_args(kafka), "--loglevel", "warning",
            *signing_args(keys), *(["--precompute"] if precompute else [])]


def timeline(scenario: str, duration_s: float, start_ms: int) -> list[str]:
    """The scenario and the shared start: the scheduler and the load keep one timeline."""
    return ["--scenario", str(plan.scenario_path(scenario)), "--duration", str(duration_s),
            "--start-at-ms", str(start_ms)]


def scheduler(times: list[str], kafka: KafkaSettings, keys: Path, *, port: int) -> list[str]:
    """The capacity scheduler on the run's timeline."""
    return ["scheduler", *times, "--metrics-port", str(port), *kafka_args(kafka),
            *signing_args(keys)]


def loadgen(times: list[str], kafka: KafkaSettings, keys: Path, *, rate: float | None,
            out: Path, port: int) -> list[str]:
    """The load generator on the run's timeline. Its client routes from the replicas topic: a
    reclaimed replica says it is draining when its notice arrives, before it goes; one
    starting is not there until it serves."""
    rates = ["--rate", str(rate)] if rate else []
    return ["loadgen", *times, "--membership", *rates, "--out", str(out),
            "--metrics-port", str(port), *kafka_args(kafka), *signing_args(keys)]
