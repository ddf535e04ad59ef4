"""Control-plane ingest: WindowReports/s through the Faust control plane vs a raw consumer loop.

Both sides consume the same pre-produced telemetry messages and do the same work per report
(strict decode, then `ScopeController.on_report`); the reference is a plain confluent-kafka
consumer loop in this process. `ratio` = control plane / raw loop; the targets are >= 20,000
reports/s per process and ratio >= 0.5 (within 2x).

Faust costs tens of microseconds per *message* whatever the message holds, so the headline run
sends batches of reports (a JSON array per message, as a host speaking for many replicas does);
the `single` run sends one report per message, as a lone worker does, to show that cost.

    python -m bench.ingest [--reports N] [--batch B]   # $KAFKA_BOOTSTRAP_SERVERS or local broker
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import broker
from schemas import kafka_clients
from schemas.codec import decode_telemetry, encode, encode_telemetry
from schemas.contract import WindowReport
from schemas.kafka_clients import OFFSET_BEGINNING
from schemas.kafka_config import KafkaSettings
from schemas.sketch import new_sketch, to_wire
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from surplus.live.procs import Child
from surplus.localkafka import free_port
from surplus.topics import apply_topics

SCOPES = ("eu1", "us2", "ap3", "sa4")


def _messages(n: int, batch: int) -> list[tuple[str, bytes]]:
    """`n` reports over the scopes, `batch` per message (one scope per message: its key)."""
    sketch = new_sketch()
    for i in range(300):
        sketch.add(2.0 + (i % 40))
    wire = to_wire(sketch)
    by_scope: dict[str, list[WindowReport]] = {s: [] for s in SCOPES}
    for i in range(n):
        scope = SCOPES[i % len(SCOPES)]
        by_scope[scope].append(WindowReport(
            pool_id=f"{scope}/rank/baseline/a100/baseline", worker_id=f"w{i % 1000}",
            region=scope, service="rank", model="baseline", tier="baseline", accelerator="a100",
            window_start_ms=i, window_end_ms=i + 1000, requests=300, baseline_requests=300,
            latency_ms=wire, utilisation=0.5, capacity_rps=400.0))
    out = []
    for scope, reports in by_scope.items():
        for start in range(0, len(reports), batch):
            chunk = reports[start:start + batch]
            out.append((scope, encode(chunk[0]) if batch == 1 else encode_telemetry(chunk)))
    return out


def _produce(kafka: KafkaSettings, reports: list[tuple[str, bytes]]) -> None:
    producer = kafka_clients.producer(kafka, **{"linger.ms": 20, "batch.num.messages": 10000})
    topic = kafka.topic("telemetry")
    for key, value in reports:
        kafka_clients.produce_waiting(producer, topic, key=key, value=value)
    producer.flush(60)


def raw_loop(kafka: KafkaSettings, n: int) -> float:
    """Reports/s of a plain consumer loop doing the same decode + merge."""
    consumer = kafka_clients.consumer(kafka, f"raw-{uuid.uuid4().hex}",
                                      **{"enable.auto.commit": False})
    topic = kafka.topic("telemetry")
    consumer.assign(kafka_clients.starting_at(
        topic, kafka_clients.partitions(consumer, topic, timeout_s=10), OFFSET_BEGINNING))
    controllers = {s: ScopeController(s, ControlConfig()) for s in SCOPES}
    seen, first, started = 0, 0, 0.0
    while seen < n:
        for msg in consumer.consume(1000, 1.0):
            value, key = msg.value(), msg.key()
            if msg.error() or value is None or key is None:
                continue
            reports = decode_telemetry(value)
            if not seen:
                started, first = time.perf_counter(), len(reports)
            controller = controllers[key.decode()]
            for report in reports:
                controller.on_report(report, report.window_end_ms)
            seen += len(reports)
    elapsed = time.perf_counter() - started
    consumer.close()
    return (n - first) / elapsed


def _events_seen(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    match = re.search(r"surplus_control_reports_total ([0-9.e+]+)", text)
    return float(match.group(1)) if match else 0.0


def control_plane(kafka: KafkaSettings, n: int, workdir: Path) -> float:
    """Reports/s of a real `surplus control-plane` process reading the same topic."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = Child("control-plane", [
        "control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix, "--app-id",
        f"{kafka.prefix}bench", "--partitions", "2", "--metrics-port", str(port),
        "--data-dir", str(workdir)], workdir).start()
    try:
        deadline = time.monotonic() + 120
        first_t = first_n = 0.0
        while time.monotonic() < deadline:
            assert proc.alive(), proc.tail(20)
            try:
                count = _events_seen(port)
            except OSError:
                count = 0.0
            now = time.perf_counter()
            if count and not first_t:
                first_t, first_n = now, count
            if count >= n:
                return (count - first_n) / (now - first_t)
            time.sleep(0.05)
        raise TimeoutError(f"control plane saw {count} of {n} reports in 120 s")
    finally:
        proc.stop()


def measure(bootstrap: str, reports: int, batch: int, workdir: Path) -> dict[str, Any]:
    """One configuration on fresh topics: control plane and raw loop on the same messages."""
    kafka = KafkaSettings(bootstrap=bootstrap, prefix=f"bench{uuid.uuid4().hex[:6]}.")
    apply_topics(kafka.confluent(), kafka.prefix, partitions_override=2)
    messages = _messages(reports, batch)
    _produce(kafka, messages)
    reference = raw_loop(kafka, reports)
    faust_rate = control_plane(kafka, reports, workdir / kafka.prefix)
    return {"reports": reports, "messages": len(messages), "reports_per_message": batch,
            "reports_per_s": round(faust_rate), "raw_reports_per_s": round(reference),
            "ratio": round(faust_rate / reference, 3)}


def run(reports: int = 200_000, batch: int = 50, single_reports: int = 20_000,
        bootstrap: str | None = None) -> dict[str, Any]:
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        bootstrap = bootstrap or stack.enter_context(broker(Path(tmp)))
        batched = measure(bootstrap, reports, batch, Path(tmp))
        single = measure(bootstrap, single_reports, 1, Path(tmp))
    return {"bench": "ingest", **batched, "single": single,
            "target": ">= 20000 reports/s per process and ratio >= 0.5",
            "meets_target": batched["reports_per_s"] >= 20_000 and batched["ratio"] >= 0.5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reports", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--single-reports", type=int, default=20_000)
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    print(json.dumps(run(args.reports, args.batch, args.single_reports, args.bootstrap)))


if __name__ == "__main__":
    main()
