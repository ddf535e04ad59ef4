"""The decision/label join in the control plane, as a real Faust worker on a real broker.

Pins: a client's batch of decision records (one message) and labels on the scope's
partition, one per message keyed by request id or a batch keyed by the scope, are joined;
duplicates and labels for unknown ids are counted by reason and change nothing; a label on
another partition and one that does not decode go to the dead-letter topic with the reason;
the joined values reach the measured lift and the segment gains on /metrics.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import decode, encode, encode_outcomes
from schemas.contract import (
    DECISION_VERSION,
    DeadLetter,
    LiftReport,
    OutcomeLabel,
    RoutingOutcome,
)
from schemas.kafka_config import KafkaSettings
from schemas.topics import scope_partition
from surplus.localkafka import free_port
from tests.integration.fleet import metric, scrape
from tests.integration.harness import Proc, TopicReader, publish

pytestmark = [pytest.mark.kafka]

SCOPE = "eu1"
PARTITIONS = 2
N = 400


def _start(kafka: KafkaSettings, tmp_path: Path, port: int) -> Proc:
    config = tmp_path / "control.toml"
    config.write_text("period_s = 1.0\nttl_s = 5.0\n[labels]\nwindow_s = 600.0\n")
    return Proc(["control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix,
                 "--config", str(config), "--app-id", f"{kafka.prefix}cp",
                 "--partitions", str(PARTITIONS), "--data-dir", str(tmp_path / "state"),
                 "--metrics-port", str(port), "--loglevel", "warning"], tmp_path / "cp.log")


def _labels(kafka: KafkaSettings, items: list[tuple[str, bytes, int]]) -> None:
    producer = kafka_clients.producer(kafka)
    for key, value, partition in items:
        producer.produce(kafka.topic("labels"), key=key, value=value, partition=partition)
    assert producer.flush(10) == 0


def test_decisions_and_labels_join_on_the_broker_and_bad_labels_are_dead_lettered(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    port = free_port()
    proc = _start(kafka, tmp_path, port)
    dead = TopicReader(kafka, "deadletter")
    try:
        now = wall_ms()
        decisions = [RoutingOutcome(
            v=DECISION_VERSION, ts_ms=now, scope=SCOPE, request_id=f"r{i}", segment="s",
            model="powerful" if i % 2 else "baseline", propensity=0.5, extra=4,
            holdout=i % 10 == 0) for i in range(N)]
        publish(kafka, "outcomes", [(SCOPE, encode_outcomes(decisions))])  # one message
        right = scope_partition(SCOPE, PARTITIONS)
        wrong = 1 - right

        def value(i: int) -> float:
            return 1.0 + (0.5 if i % 2 else 0.0) + (0.0 if i % 10 == 0 else 0.25)

        def one(i: int) -> OutcomeLabel:
            return OutcomeLabel(ts_ms=now + 1, scope=SCOPE, request_id=f"r{i}", value=value(i))

        half = N // 2
        labels = [(f"r{i}", encode(one(i)), right) for i in reversed(range(half))]  # shuffled
        labels.insert(57, (SCOPE, encode_outcomes([one(i) for i in range(half, N)]), right))
        labels += labels[:10]                                     # retried: duplicates
        labels += [(f"x{i}", encode(OutcomeLabel(ts_ms=now, scope=SCOPE, request_id=f"x{i}",
                                                 value=1.0)), right) for i in range(50)]
        labels.append(("y", encode(OutcomeLabel(ts_ms=now, scope=SCOPE, request_id="y",
                                                value=1.0)), wrong))
        labels.append(("z", b'{"v":4,"ts_ms":1,"scope":"eu1","request_id":"z"}', right))
        # The decisions first: a label read before its decision is an orphan (and its retry,
        # read after it, joins), so wait until the control plane has taken them.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.alive(), proc.output()[-3000:]
            try:
                if metric(scrape(f"http://127.0.0.1:{port}/metrics"),
                          "surplus_control_decisions_total") >= N:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        _labels(kafka, labels)

        deadline = time.monotonic() + 60
        samples: dict[str, float] = {}
        while time.monotonic() < deadline:
            assert proc.alive(), proc.output()[-3000:]
            try:
                samples = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                samples = {}
            # the gauges move at each tick, a scrape may fall between two of them: wait for
            # the orphans, the last to arrive, and one more tick
            if metric(samples, "surplus_control_labels_total", scope=SCOPE,
                      outcome="orphan") >= 50:
                time.sleep(1.5)
                samples = scrape(f"http://127.0.0.1:{port}/metrics")
                break
            time.sleep(0.5)

        def count(outcome: str) -> float:
            return metric(samples, "surplus_control_labels_total", scope=SCOPE, outcome=outcome)

        assert count("joined") == N, samples
        got = {o: count(o) for o in ("joined", "duplicate", "orphan", "late", "inline")}
        assert got == {"joined": N, "duplicate": 10, "orphan": 50, "late": 0, "inline": 0}, got
        assert metric(samples, "surplus_control_decisions_total") == N
        assert metric(samples, "surplus_control_labels_received_total") == N + 10 + 50
        lift = metric(samples, "surplus_control_lift", scope=SCOPE, lever="all",
                      stat="measured")
        assert lift == pytest.approx(0.25 + 0.5 * 0.5, abs=0.05)   # rma 0.25, sbm 0.5 on half
        gain = metric(samples, "surplus_control_segment_gain", scope=SCOPE, segment="s",
                      stat="measured")
        assert gain == pytest.approx(0.5, abs=1e-6)

        reports = TopicReader(kafka, "estimates")
        end = time.monotonic() + 20
        latest: LiftReport | None = None
        while time.monotonic() < end and (latest is None or latest.join.get("joined") != N):
            reports.poll(0.5)
            if reports.messages:
                latest = decode(LiftReport, reports.messages[-1].value())
        assert latest is not None and latest.scope == SCOPE and latest.join["joined"] == N
        assert latest.lift["all"].measured == pytest.approx(lift)

        letters: list[DeadLetter] = []
        end = time.monotonic() + 20
        while time.monotonic() < end and len(letters) < 2:
            dead.poll(0.5)
            letters = [decode(DeadLetter, m.value()) for m in dead.messages]
        reasons = sorted(letter.reason for letter in letters)
        assert len(letters) == 2, reasons
        assert any("wrong_partition" in r for r in reasons), reasons
        assert any("value" in r for r in reasons), reasons        # names the missing field
        assert all(letter.source_topic == kafka.topic("labels") for letter in letters)
    finally:
        proc.stop()
