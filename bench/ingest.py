"""Control-plane ingest: WindowReports/s through the Faust control plane vs a raw consumer loop.

Both sides consume the same pre-produced reports from the same telemetry topic and do the same
work per report (strict decode, then `ScopeController.on_report`); the reference is a plain
confluent-kafka consumer loop in this process. The ratio (reference / control plane) is what
the target speaks of: the control plane within 2x of the raw loop, and >= 20,000 reports/s.

    python -m bench.ingest [--reports N]     # uses $KAFKA_BOOTSTRAP_SERVERS or a local broker
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

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.common import broker
from schemas.codec import decode, encode
from schemas.contract import WindowReport
from schemas.kafka_config import KafkaSettings
from schemas.sketch import new_sketch, to_wire
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from surplus.localkafka import free_port
from surplus.topics import apply_topics

SCOPES = ("eu1", "us2", "ap3", "sa4")


def _reports(n: int) -> list[tuple[str, bytes]]:
    sketch = new_sketch()
    for i in range(300):
        sketch.add(2.0 + (i % 40))
    wire = to_wire(sketch)
    out = []
    for i in range(n):
        scope = SCOPES[i % len(SCOPES)]
        report = WindowReport(
            pool_id=f"{scope}/rank/baseline/a100/baseline", worker_id=f"w{i % 100}",
            region=scope, service="rank", model="baseline", tier="baseline", accelerator="a100",
            window_start_ms=i, window_end_ms=i + 1000, requests=300, baseline_requests=300,
            latency_ms=wire, utilisation=0.5, capacity_rps=400.0)
        out.append((scope, encode(report)))
    return out


def _produce(kafka: KafkaSettings, reports: list[tuple[str, bytes]]) -> None:
    producer = Producer(kafka.producer(**{"linger.ms": 20, "batch.num.messages": 10000}))
    topic = kafka.topic("telemetry")
    for key, value in reports:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def raw_loop(kafka: KafkaSettings, n: int) -> float:
    """Reports/s of a plain consumer loop doing the same decode + merge."""
    consumer = Consumer(kafka.confluent(**{"group.id": f"raw-{uuid.uuid4().hex}",
                                           "enable.auto.commit": False}))
    topic = kafka.topic("telemetry")
    meta = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                     for p in meta.topics[topic].partitions])
    controllers = {s: ScopeController(s, ControlConfig()) for s in SCOPES}
    seen, started = 0, 0.0
    while seen < n:
        for msg in consumer.consume(1000, 1.0):
            if msg.error():
                continue
            if not seen:
                started = time.perf_counter()
            report = decode(WindowReport, msg.value())
            controllers[msg.key().decode()].on_report(report, report.window_end_ms)
            seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return (n - 1) / elapsed


def _events_seen(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    match = re.search(r'surplus_control_events_total\{topic="telemetry"\} ([0-9.e+]+)', text)
    return float(match.group(1)) if match else 0.0


def control_plane(kafka: KafkaSettings, n: int, workdir: Path) -> float:
    """Reports/s of a real `surplus control-plane` process reading the same topic."""
    from tests.integration.harness import Proc

    port = free_port()
    proc = Proc(["control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix,
                 "--app-id", f"{kafka.prefix}bench", "--partitions", "2", "--metrics-port",
                 str(port), "--data-dir", str(workdir)], workdir / "control-plane.log")
    try:
        deadline = time.monotonic() + 120
        first_t = first_n = 0.0
        while time.monotonic() < deadline:
            assert proc.alive(), proc.output()[-2000:]
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


def run(reports: int = 60_000, bootstrap: str | None = None) -> dict[str, Any]:
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        bootstrap = bootstrap or stack.enter_context(broker(Path(tmp)))
        kafka = KafkaSettings(bootstrap=bootstrap, prefix=f"bench{uuid.uuid4().hex[:6]}.")
        apply_topics(kafka.confluent(), kafka.prefix, partitions_override=2)
        _produce(kafka, _reports(reports))
        reference = raw_loop(kafka, reports)
        faust_rate = control_plane(kafka, reports, Path(tmp))
    return {"bench": "ingest", "reports": reports,
            "control_plane_reports_per_s": round(faust_rate),
            "raw_loop_reports_per_s": round(reference),
            "raw_over_control_plane": round(reference / faust_rate, 2),
            "target": ">= 20000 reports/s and raw_over_control_plane <= 2"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reports", type=int, default=60_000)
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    print(json.dumps(run(args.reports, args.bootstrap)))


if __name__ == "__main__":
    main()
