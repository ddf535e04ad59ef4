"""Benchmark: the decision/label join, against a raw consume-and-dict-lookup loop.

Decisions (client batches of 500 per outcomes message) are on the broker first, then their
labels in a shuffled order plus 5% for unknown ids, as batches of ``batch`` labels of one
scope per message (keyed by the scope). Two runs on the same messages:

- ``kafka``: a real ``surplus control-plane`` process (Faust) reads both topics; its rate is
  labels taken into the join per second (``surplus_control_labels_received_total``), after it
  has read the decisions. The reference is a plain confluent-kafka consumer loop in this
  process doing what no join can avoid: consume, decode the batch, look each request id up in
  a dict of the decisions. ``ratio`` = control plane / reference.
- ``core``: the same label messages in this process, no consumer: codec, rulebook
  (``streams.control.dispatch``), ``ScopeController.on_label`` (the join and the estimates),
  against decode and a dict lookup; best of ``repeat``.

    python -m bench.join [labels]      # $KAFKA_BOOTSTRAP_SERVERS or a local broker

Target: >= 50,000 labels/s per control-plane process.
"""

from __future__ import annotations

import json
import random
import re
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import broker
from schemas import kafka_clients
from schemas.codec import decode, decode_labels, decode_outcomes, encode, encode_outcomes
from schemas.contract import DECISION_VERSION, OutcomeLabel, RoutingOutcome
from schemas.kafka_clients import OFFSET_BEGINNING
from schemas.kafka_config import KafkaSettings
from schemas.topics import scope_partition
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from streams.control.dispatch import RULES, dispatch_all
from surplus.live.procs import Child
from surplus.localkafka import free_port
from surplus.topics import apply_topics

TARGET_LABELS_PER_S = 50_000
SCOPE = "eu1"


def _messages(n: int, seed: int) -> tuple[list[bytes], list[tuple[str, bytes]]]:
    rng = random.Random(seed)
    decisions = [RoutingOutcome(
        v=DECISION_VERSION, ts_ms=1_700_000_000_000 + i, scope=SCOPE, request_id=f"{SCOPE}-{i}",
        segment=f"s{i % 8}", model="powerful" if rng.random() < 0.3 else "baseline",
        propensity=0.3, extra=16, holdout=rng.random() < 0.01) for i in range(n)]
    batches = [encode_outcomes(decisions[i:i + 500]) for i in range(0, n, 500)]
    labels = [(f"{SCOPE}-{i}", encode(OutcomeLabel(
        ts_ms=1_700_000_060_000 + i, scope=SCOPE, request_id=f"{SCOPE}-{i}",
        value=rng.gauss(1.0, 0.5)))) for i in range(n)]
    labels += [(f"x{i}", encode(OutcomeLabel(ts_ms=1_700_000_060_000, scope=SCOPE,
                                            request_id=f"x{i}", value=1.0)))
               for i in range(n // 20)]
    rng.shuffle(labels)
    return batches, labels


def _join(batches: list[bytes], labels: list[tuple[str, bytes]]) -> tuple[float, int]:
    controller = ScopeController(SCOPE, ControlConfig())
    controllers = {SCOPE: controller}.__getitem__
    outcomes, rule = RULES["outcomes"], RULES["labels"]
    now = 1_700_000_100_000
    for batch in batches:
        dispatch_all(outcomes, SCOPE, decode_outcomes(batch), controllers, now)
    started = time.perf_counter()
    for key, value in labels:
        dispatch_all(rule, key, decode_labels(value), controllers, now)
    return time.perf_counter() - started, controller.join.counts["joined"]


def _reference(batches: list[bytes], labels: list[tuple[str, bytes]]) -> tuple[float, int]:
    pending: dict[str, RoutingOutcome] = {}
    for batch in batches:
        for d in decode_outcomes(batch):
            pending[d.request_id] = d
    started = time.perf_counter()
    found = 0
    for _key, value in labels:
        for label in decode_labels(value):
            if pending.get(label.request_id) is not None:
                found += 1
    return time.perf_counter() - started, found


PARTITIONS = 2


def _produce(kafka: KafkaSettings, logical: str, items: list[tuple[str, bytes]]) -> None:
    producer = kafka_clients.producer(kafka, **{"linger.ms": 20, "batch.num.messages": 10000})
    topic, partition = kafka.topic(logical), scope_partition(SCOPE, PARTITIONS)
    for key, value in items:
        kafka_clients.produce_waiting(producer, topic, key=key, value=value,
                                      partition=partition)
    producer.flush(60)


def _label_batches(labels: list[tuple[str, bytes]], batch: int) -> list[tuple[str, bytes]]:
    values = [decode(OutcomeLabel, v) for _, v in labels]
    return [(SCOPE, encode_outcomes(values[i:i + batch])) for i in range(0, len(values), batch)]


def raw_loop(kafka: KafkaSettings, decisions: int, labels: int) -> float:
    """Labels/s of a plain consumer loop: consume, decode, one dict lookup per label."""
    consumer = kafka_clients.consumer(kafka, f"raw-{uuid.uuid4().hex}",
                                      **{"enable.auto.commit": False})
    pending: dict[str, RoutingOutcome] = {}
    for logical, want in (("outcomes", decisions), ("labels", labels)):
        topic = kafka.topic(logical)
        consumer.assign(kafka_clients.starting_at(
            topic, kafka_clients.partitions(consumer, topic, timeout_s=10), OFFSET_BEGINNING))
        seen, found, started, first = 0, 0, 0.0, 0
        while seen < want:
            for msg in consumer.consume(1000, 1.0):
                value = msg.value()
                if msg.error() or value is None:
                    continue
                if logical == "outcomes":
                    for d in decode_outcomes(value):
                        pending[d.request_id] = d
                    seen += 1
                    continue
                batch = decode_labels(value)
                if not seen:
                    started, first = time.perf_counter(), len(batch)
                for label in batch:
                    found += pending.get(label.request_id) is not None
                seen += len(batch)
        consumer.unassign()
    consumer.close()
    return (labels - first) / (time.perf_counter() - started)


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def control_plane(kafka: KafkaSettings, decisions: int, labels: list[tuple[str, bytes]],
                  n: int, workdir: Path) -> dict[str, float]:
    """Labels/s of a real control-plane process once it holds the decisions."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = Child("control-plane", [
        "control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix, "--app-id",
        f"{kafka.prefix}bench", "--partitions", str(PARTITIONS), "--metrics-port", str(port),
        "--data-dir", str(workdir)], workdir).start()
    try:
        deadline = time.monotonic() + 120
        while _safe(port, "surplus_control_decisions_total") < decisions:
            assert proc.alive() and time.monotonic() < deadline, proc.tail(20)
            time.sleep(0.1)
        _produce(kafka, "labels", labels)
        first_t = first_n = count = 0.0
        while time.monotonic() < deadline:
            assert proc.alive(), proc.tail(20)
            count = _safe(port, "surplus_control_labels_received_total")
            now = time.perf_counter()
            if count and not first_t:
                first_t, first_n = now, count
            if count >= n:
                return {"labels_per_s": (count - first_n) / (now - first_t)}
            time.sleep(0.05)
        raise TimeoutError(f"control plane took {count} of {n} labels in 120 s")
    finally:
        proc.stop()


def _safe(port: int, name: str) -> float:
    try:
        return _metric(port, name)
    except OSError:
        return 0.0


def on_kafka(bootstrap: str, batches: list[bytes], labels: list[tuple[str, bytes]],
             batch: int, workdir: Path) -> dict[str, Any]:
    kafka = KafkaSettings(bootstrap=bootstrap, prefix=f"bench{uuid.uuid4().hex[:6]}.")
    apply_topics(kafka.confluent(), kafka.prefix, partitions_override=PARTITIONS)
    _produce(kafka, "outcomes", [(SCOPE, b) for b in batches])
    messages = _label_batches(labels, batch)
    faust = control_plane(kafka, sum(len(decode_outcomes(b)) for b in batches), messages,
                          len(labels), workdir / kafka.prefix)["labels_per_s"]
    reference = raw_loop(kafka, len(batches), len(labels))
    return {"labels": len(labels), "messages": len(messages), "labels_per_message": batch,
            "labels_per_s": round(faust), "raw_labels_per_s": round(reference),
            "ratio": round(faust / reference, 3)}


def run(labels: int = 200_000, repeat: int = 3, seed: int = 1, batch: int = 500,
        bootstrap: str | None = None, kafka: bool = True) -> dict[str, Any]:
    core = run_core(labels, repeat, seed, batch)
    if not kafka:
        return {"bench": "join", "core": core, "meets_target": core["meets_target"]}
    batches, messages = _messages(labels, seed)
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        bootstrap = bootstrap or stack.enter_context(broker(Path(tmp)))
        live = on_kafka(bootstrap, batches, messages, batch, Path(tmp))
    return {"bench": "join", **live, "core": core,
            "target_labels_per_s": TARGET_LABELS_PER_S,
            "meets_target": live["labels_per_s"] >= TARGET_LABELS_PER_S}


def run_core(labels: int = 200_000, repeat: int = 3, seed: int = 1,
             batch: int = 500) -> dict[str, Any]:
    batches, singles = _messages(labels, seed)
    messages = _label_batches(singles, batch)
    best_join = best_ref = float("inf")
    joined = found = 0
    for _ in range(repeat):
        t, joined = _join(batches, messages)
        best_join = min(best_join, t)
        t, found = _reference(batches, messages)
        best_ref = min(best_ref, t)
    rate = len(singles) / best_join
    return {"labels": len(singles), "joined": joined, "reference_found": found,
            "labels_per_s": round(rate), "reference_per_s": round(len(singles) / best_ref),
            "ratio_to_reference": round(best_ref / best_join, 3),
            "target_labels_per_s": TARGET_LABELS_PER_S,
            "meets_target": rate >= TARGET_LABELS_PER_S and joined == found}


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1])) if len(sys.argv) > 1 else run()))
