"""Pending decisions survive a kill -9 of the control plane: on its disk, and on the changelog.

A real `surplus control-plane` process on a real broker takes a client's decisions and commits
their offsets (so the broker would not deliver them again), then is killed with SIGKILL. It
is restarted on the same data directory (a process restarted in place), takes half of the
labels and more decisions, and is killed again; the third start is on an empty data directory
(the partition moved to a machine without that disk), so only the changelog topic holds the
pending decisions. Pins: every label sent after a restart joins its decision, none is an
orphan, across both restarts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import encode_outcomes
from schemas.contract import DECISION_VERSION, OutcomeLabel, RoutingOutcome
from schemas.kafka_config import KafkaSettings
from schemas.topics import scope_partition
from streams.agents.changelog import replay_changelog
from streams.agents.pending import decode_batch
from surplus.localkafka import free_port
from tests.integration.fleet import metric, scrape
from tests.integration.harness import Proc, publish

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SCOPE = "eu1"
PARTITIONS = 2
N = 1_000          # decisions before the first kill
M = 500            # decisions between the two kills
WAIT_S = 90.0      # generous: a loaded 2-core machine starts Faust slowly


def _start(kafka: KafkaSettings, tmp_path: Path, name: str, data_dir: Path, port: int) -> Proc:
    config = tmp_path / "control.toml"
    config.write_text("period_s = 1.0\nttl_s = 5.0\n[labels]\nwindow_s = 600.0\n")
    # A stable instance id: each restart takes the partitions back at once (static membership).
    return Proc(["control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix,
                 "--config", str(config), "--app-id", f"{kafka.prefix}cp",
                 "--instance-id", "cp-0", "--partitions", str(PARTITIONS),
                 "--data-dir", str(data_dir), "--metrics-port", str(port),
                 "--loglevel", "warning"], tmp_path / f"{name}.log")


def _decisions(first: int, n: int) -> list[tuple[str | None, Any]]:
    now = wall_ms()
    batch = [RoutingOutcome(v=DECISION_VERSION, ts_ms=now, scope=SCOPE, request_id=f"r{i}",
                            segment="s", model="powerful" if i % 2 else "baseline",
                            propensity=0.5, extra=4) for i in range(first, first + n)]
    return [(SCOPE, encode_outcomes(batch[i:i + 250])) for i in range(0, n, 250)]


def _labels(ids: range) -> list[tuple[str | None, Any]]:
    batch = [OutcomeLabel(ts_ms=wall_ms(), scope=SCOPE, request_id=f"r{i}", value=1.0)
             for i in ids]
    return [(SCOPE, encode_outcomes(batch[i:i + 250])) for i in range(0, len(batch), 250)]


def _until(what: str, ok: Callable[[], bool], proc: Proc) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ok():
        assert proc.alive(), proc.output()[-3000:]
        assert time.monotonic() < deadline, f"{what} not within {WAIT_S} s\n" + \
            proc.output()[-3000:]
        time.sleep(0.3)


def _sample(port: int, name: str, **labels: str) -> float:
    try:
        return metric(scrape(f"http://127.0.0.1:{port}/metrics"), name, **labels)
    except OSError:
        return -1.0


def _committed_to_the_end(kafka: KafkaSettings, logical: str) -> Callable[[], bool]:
    """Whether the control plane's group committed the scope's partition of `logical` to its
    end: the broker would not deliver those messages again after a restart."""
    consumer = kafka_clients.consumer(kafka, f"{kafka.prefix}cp")
    tp = kafka_clients.TopicPartition(kafka.topic(logical), scope_partition(SCOPE, PARTITIONS))

    def check() -> bool:
        _, high = consumer.get_watermark_offsets(tp, timeout=5)
        committed = consumer.committed([tp], timeout=5)[0].offset
        return high > 0 and committed == high

    return check


def _changelog_holds(kafka: KafkaSettings, entries: int) -> Callable[[], bool]:
    """Whether the pending changelog's scope partition holds `entries` entries or more."""
    topic = f"{kafka.prefix}{kafka.prefix}cp-pending-changelog"

    def check() -> bool:
        seen = 0

        def count(_partition: int, _key: bytes, value: bytes | None) -> None:
            nonlocal seen
            seen += len(decode_batch(value or b""))

        replay_changelog(kafka, topic, {scope_partition(SCOPE, PARTITIONS): None}, count, 10)
        return seen >= entries

    return check


def test_pending_decisions_join_after_a_kill_9_on_the_same_disk_and_on_a_new_one(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    disk = tmp_path / "disk"

    # 1. N decisions taken, their offsets committed, the changelog written; then SIGKILL.
    port = free_port()
    first = _start(kafka, tmp_path, "first", disk, port)
    try:
        publish(kafka, "outcomes", _decisions(0, N))
        _until("decisions held", lambda: _sample(
            port, "surplus_control_labels_pending", scope=SCOPE) == N, first)
        _until("outcomes committed", _committed_to_the_end(kafka, "outcomes"), first)
        _until("changelog written", _changelog_holds(kafka, N), first)
    finally:
        first.kill()

    # 2. Restarted on the same disk: half the labels join; M more decisions; SIGKILL again.
    port = free_port()
    second = _start(kafka, tmp_path, "second", disk, port)
    try:
        _until("restored", lambda: _sample(port, "surplus_control_labels_received_total")
               >= 0, second)
        publish(kafka, "labels", _labels(range(0, N // 2)))
        publish(kafka, "outcomes", _decisions(N, M))
        _until("labels joined", lambda: _sample(
            port, "surplus_control_labels_total", scope=SCOPE, outcome="joined") >= N // 2,
            second)
        _until("decisions held", lambda: _sample(port, "surplus_control_decisions_total")
               >= M, second)
        _until("outcomes and labels committed", lambda: _committed_to_the_end(
            kafka, "outcomes")() and _committed_to_the_end(kafka, "labels")(), second)
        _until("changelog written", _changelog_holds(kafka, N + N // 2 + M), second)
        time.sleep(1.5)  # a tick: the counts below are the gauges' latest
        joined = _sample(port, "surplus_control_labels_total", scope=SCOPE, outcome="joined")
        orphans = _sample(port, "surplus_control_labels_total", scope=SCOPE, outcome="orphan")
    finally:
        second.kill()
    assert (joined, orphans) == (N // 2, 0), second.output()[-3000:]

    # 3. Restarted on an empty disk (the partition moved): the changelog alone holds them.
    port = free_port()
    third = _start(kafka, tmp_path, "third", tmp_path / "other-disk", port)
    try:
        _until("restored", lambda: _sample(port, "surplus_control_labels_received_total")
               >= 0, third)
        publish(kafka, "labels", _labels(range(N // 2, N + M)))
        want = N - N // 2 + M
        _until("labels taken", lambda: _sample(port, "surplus_control_labels_received_total")
               >= want, third)
        _until("labels counted", lambda: _sample(
            port, "surplus_control_labels_total", scope=SCOPE, outcome="joined")
            + max(0.0, _sample(port, "surplus_control_labels_total", scope=SCOPE,
                               outcome="orphan")) >= want, third)
        time.sleep(1.5)
        counts = {o: _sample(port, "surplus_control_labels_total", scope=SCOPE, outcome=o)
                  for o in ("joined", "orphan", "duplicate", "late")}
        pending = _sample(port, "surplus_control_labels_pending", scope=SCOPE)
    finally:
        third.stop()
    assert counts == {"joined": want, "orphan": 0, "duplicate": 0, "late": 0}, (
        counts, third.output()[-3000:])
    assert pending == N + M   # every entry still held (joined ones until they expire)
