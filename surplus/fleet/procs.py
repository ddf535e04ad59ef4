"""Real `surplus worker` and `surplus control-plane` processes on loopback: config files,
start, readiness, /metrics scraping, capacity grants; and publishing to and reading back a topic.

Shared by the fault, hostile-input and security tests and by `surplus chaos`, which runs the
fault suite's fleet under a random schedule of faults. Kafka settings reach the processes the
way an operator's would: `--bootstrap/--prefix` flags or `SURPLUS_KAFKA_*` environment
variables (`kafka_env`), so the secured-cluster test runs exactly the code path a deployment
next to an existing cluster runs.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import decode, encode
from schemas.contract import CapacityEvent, Event
from schemas.kafka_clients import OFFSET_BEGINNING
from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring, sign
from surplus import localkafka
from surplus.live.procs import Child

E = TypeVar("E", bound=Event)


class Proc(Child):
    """A `surplus` subcommand started at once (the demo's `Child`: own session, log file, dies
    with the test process), with the crash and output helpers tests use."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None
                 ) -> None:
        super().__init__(log_path.stem, args, log_path.parent, env=env)
        self.log_path = log_path
        self.start()

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash, not a shutdown)."""
        self.send(signal.SIGKILL)
        self.wait(10)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        return super().stop(sig, timeout_s)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def publish(kafka: KafkaSettings, logical: str, items: list[tuple[str | None, Any]]) -> None:
    """Produce (key, event-or-bytes) pairs with the scope-compatible partitioner."""
    producer = kafka_clients.producer(kafka)
    for key, value in items:
        payload = value if isinstance(value, bytes) else encode(value)
        producer.produce(kafka.topic(logical), key=key, value=payload)
    assert producer.flush(10) == 0


class TopicReader:
    """Reads a whole topic from the beginning (all partitions, no group commits) and follows."""

    def __init__(self, kafka: KafkaSettings, logical: str) -> None:
        self.consumer = kafka_clients.consumer(
            kafka, f"reader-{os.getpid()}-{time.monotonic_ns()}",
            **{"enable.auto.commit": False, "auto.offset.reset": "earliest"})
        topic = kafka.topic(logical)
        self.consumer.assign(kafka_clients.starting_at(
            topic, kafka_clients.partitions(self.consumer, topic, timeout_s=10),
            OFFSET_BEGINNING))
        self.messages: list[Any] = []

    def poll(self, seconds: float) -> list[Any]:
        deadline = time.monotonic() + seconds
        new = []
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                new.append(msg)
        self.messages.extend(new)
        return new

    def wait_for(self, predicate: Callable[[Any], bool], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        for msg in self.messages:
            if predicate(msg):
                return msg
        while time.monotonic() < deadline:
            for msg in self.poll(0.2):
                if predicate(msg):
                    return msg
        return None

    def events(self, event_type: type[E]) -> list[E]:
        return [decode(event_type, m.value()) for m in self.messages]

    def close(self) -> None:
        self.consumer.close()


REGION = "eu1"
BASE_POOL = f"{REGION}/rank/baseline/a100/baseline"
POWERFUL_POOL = f"{REGION}/rank/powerful/a100/opportunistic"
#: Opportunistic capacity for RMA: extra candidates on the baseline model's replicas.
RMA_POOL = f"{REGION}/rank/baseline/a100/opportunistic"

TINY_MODEL = """
[model]
device = "cpu"
threads = 1
[model.config]
num_dense = 4
num_sparse = 3
rows_per_table = 64
embedding_dim = 4
bottom_mlp = [8]
top_mlp = [8]
deep_mlp = [16]
cross_layers = 1
"""
NUM_DENSE, NUM_SPARSE = 4, 3


def kafka_env(kafka: KafkaSettings) -> dict[str, str]:
    """`SURPLUS_KAFKA_*` variables that reproduce `kafka` in a child process."""
    env: dict[str, str] = {}
    for key, value in kafka.model_dump().items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"SURPLUS_KAFKA_{key.upper()}"] = (str(value).lower() if isinstance(value, bool)
                                               else str(value))
    return env


def control_toml(tmp_path: Path, name: str = "control", period_s: float = 1.0,
                 ttl_s: float = 6.0, min_samples: int = 10, extra: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"period_s = {period_s}\nttl_s = {ttl_s}\nmin_samples = {min_samples}\n"
                    + extra)
    return path


class WorkerProc(Proc):
    """One `surplus worker` on a known loopback port."""

    def __init__(self, tmp_path: Path, name: str, *, tier: str = "baseline",
                 model: str = "baseline", kafka: KafkaSettings | None = None,
                 env: dict[str, str] | None = None, report_interval_s: float = 0.5,
                 max_wait_ms: float = 2.0, extra_toml: str = "",
                 args: list[str] | None = None) -> None:
        self.name = name
        self.port = localkafka.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp_path / f"{name}.toml"
        # CPU processes standing in for an A100 fleet (`accelerator_stand_in`)
        config.write_text(f'worker_id = "{name}"\nregion = "{REGION}"\naccelerator = "a100"\n'
                          "accelerator_stand_in = true\n"
                          f"report_interval_s = {report_interval_s}\nreadiness_timeout_s = 20.0\n"
                          f"{extra_toml}\n{TINY_MODEL}\n[batching]\nmax_wait_ms = {max_wait_ms}\n")
        flags = ["worker", "--config", str(config), "--port", str(self.port), "--tier", tier,
                 "--model", model, "--loglevel", "warning"]
        if kafka is not None:
            flags += ["--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix]
        super().__init__(flags + (args or []), tmp_path / f"{name}.log", env=env)

    def get(self, path: str, timeout_s: float = 2.0) -> tuple[int, dict[str, Any] | str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout_s) as resp:
                status, raw = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read().decode()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def wait_ready(self, timeout_s: float = 60.0, *, draining_ok: bool = False) -> float:
        """Seconds until /readyz says ready (the model serves, targets were read); with
        ``draining_ok``, or until it serves while draining: a replica started while a reclaim
        of its pool was pending applies it and stays reclaimed (baseline only, never ready)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            assert self.alive(), f"worker {self.name} died:\n{self.output()[-3000:]}"
            try:
                status, body = self.get("/readyz", timeout_s=1.0)
                if status == 200 or (draining_ok and isinstance(body, dict)
                                     and "draining_until_ms" in body
                                     and body.get("model") != "loading"):
                    return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"worker {self.name} not ready in {timeout_s}s:\n"
                             f"{self.output()[-3000:]}")

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics as `name{label="v",...}` -> value."""
        return scrape(self.url + "/metrics")


class ControlProc(Proc):
    """One `surplus control-plane` process (a Faust worker) of consumer group `app_id`."""

    def metrics(self) -> dict[str, float]:
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def published(self) -> dict[str, float]:
        """ControlTargets this process published, by scope (0 while its metrics are not up)."""
        try:
            samples = self.metrics()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for key, value in samples.items():
            if key.startswith("surplus_control_targets_total{"):
                scope = key.split('scope="', 1)[1].split('"', 1)[0]
                out[scope] = out.get(scope, 0.0) + value
        return out

    def __init__(self, tmp_path: Path, name: str, kafka: KafkaSettings, *, app_id: str,
                 config: Path, env: dict[str, str] | None = None, partitions: int = 2,
                 flags: bool = True, args: list[str] | None = None) -> None:
        self.name = name
        self.metrics_port = localkafka.free_port()
        cmd = ["control-plane", "--config", str(config), "--app-id", app_id,
               "--metrics-port", str(self.metrics_port),
               "--partitions", str(partitions), "--data-dir", str(tmp_path / "state" / name),
               "--loglevel", "warning"]
        if flags:
            cmd += ["--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix]
        super().__init__(cmd + (args or []), tmp_path / f"{name}.log", env=env)


def grant(kafka: KafkaSettings, pool_id: str, units: float = 8.0, cpu: float = 64.0,
          event_id: str | None = None, region: str = REGION,
          key: Keyring | bytes | None = None) -> None:
    """The scheduler's grant of opportunistic capacity to `pool_id` for ten minutes (signed
    with ``key`` where the control plane holds one)."""
    now = wall_ms()
    event = CapacityEvent(
        event_id=event_id or f"grant-{pool_id}-{now}", ts_ms=now, region=region,
        pool_id=pool_id, kind="grant", accelerator="a100", accelerator_units=units,
        cpu_units=cpu, expires_at_ms=now + 600_000)
    publish(kafka, "capacity", [(region, event if key is None else sign(event, key))])


def scrape(url: str) -> dict[str, float]:
    """Every sample of a Prometheus endpoint as `name{label="v",...}` -> value."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """One sample's value (0 when absent: a counter not incremented yet)."""
    key = name
    if labels:
        key += "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return samples.get(key, 0.0)


def by_label(samples: dict[str, float], name: str, label: str) -> dict[str, float]:
    """Every sample of `name` keyed by the value of one label, e.g. verdicts by verdict."""
    out: dict[str, float] = {}
    prefix = f'{name}{{{label}="'
    for key, value in samples.items():
        if key.startswith(prefix):
            out[key[len(prefix):].split('"', 1)[0]] = value
    return out
