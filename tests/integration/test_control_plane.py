"""The control plane as a real Faust worker process on a real broker.

Pins: targets every period with an epoch that only grows; the preemption fast path; bad input to
the dead-letter topic with its source offset; state surviving kill -9 (epoch continues, no
burst); two processes sharing partitions publish each scope once per period and hand over.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from schemas.clock import wall_ms
from schemas.codec import decode
from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    DeadLetter,
    PreemptionNotice,
)
from schemas.kafka_config import KafkaSettings
from schemas.sketch import new_sketch, to_wire
from surplus.localkafka import free_port
from tests.integration.fleet import scrape
from tests.integration.harness import Proc, TopicReader, publish
from tests.unit.schemas.samples import SAMPLES

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PERIOD_S = 1.0
SCOPES = ("eu1", "us2")  # hash to different partitions of 2 (murmur2)
US2_TTL_S = 4.0


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "control.toml"
    # us2 runs with a TTL of its own: a region's [scopes.<region>] overrides reach its
    # controller in the live process (the first test checks the targets carry it).
    path.write_text(f"period_s = {PERIOD_S}\nttl_s = 5.0\n[scopes.us2]\nttl_s = {US2_TTL_S}\n")
    return path


def _start(kafka: KafkaSettings, tmp_path: Path, name: str, app_id: str = "cp",
           metrics_port: int = 0) -> Proc:
    return Proc(["control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix,
                 "--config", str(_config(tmp_path)), "--app-id", f"{kafka.prefix}{app_id}",
                 "--partitions", "2", "--data-dir", str(tmp_path / "state"),
                 "--metrics-port", str(metrics_port), "--loglevel", "warning"],
                tmp_path / f"{name}.log")


def _grant(scope: str, ts_ms: int) -> CapacityEvent:
    return CapacityEvent(event_id=f"g-{scope}-{ts_ms}", ts_ms=ts_ms, region=scope,
                         pool_id=f"{scope}/rank/baseline/a100/opportunistic", kind="grant",
                         accelerator="a100", accelerator_units=8.0, cpu_units=64.0,
                         expires_at_ms=ts_ms + 600_000)


def _reports(scope: str, ts_ms: int, n: int = 4, latency_ms: float = 5.0
             ) -> list[tuple[str | None, Any]]:
    report = next(e for e in SAMPLES if type(e).__name__ == "WindowReport")
    sketch = new_sketch()
    for i in range(200):
        sketch.add(latency_ms + (i % 10))
    out: list[tuple[str | None, Any]] = []
    for i in range(n):
        out.append((scope, report.__class__(**{
            **{f: getattr(report, f) for f in report.__struct_fields__},
            "region": scope, "pool_id": f"{scope}/rank/baseline/a100/opportunistic",
            "worker_id": f"w{i}", "window_start_ms": ts_ms - 1000, "window_end_ms": ts_ms,
            "requests": 200, "baseline_requests": 200, "latency_ms": to_wire(sketch)})))
    return out


def _feed(kafka: KafkaSettings, seconds: float, scopes: tuple[str, ...] = SCOPES,
          latency_ms: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = wall_ms()
        for scope in scopes:
            publish(kafka, "telemetry", _reports(scope, now, latency_ms=latency_ms))
        time.sleep(0.25)


def _targets(reader: TopicReader, scope: str) -> list[ControlTargets]:
    return [t for t in reader.events(ControlTargets) if t.scope == scope]


def _targets_and_metrics(reader: TopicReader, scope: str,
                         port: int) -> tuple[list[ControlTargets], dict[str, float]]:
    """The targets read so far and a scrape taken after the last of them and before the next
    (the gauges describe the period that issued the last target read)."""
    for _ in range(10):
        targets = _targets(reader, scope)
        metrics = scrape(f"http://127.0.0.1:{port}/metrics")
        reader.poll(0.5)
        if len(_targets(reader, scope)) == len(targets):
            return targets, metrics
    raise AssertionError("a new target arrived around every scrape")


def _wait_targets(reader: TopicReader, scope: str, count: int, timeout_s: float,
                  *procs: Proc) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(_targets(reader, scope)) < count:
        for proc in procs:
            assert proc.alive(), f"control plane died: {proc.output()[-3000:]}"
        reader.poll(0.3)


def test_targets_every_period_with_growing_epoch_fast_path_and_dead_letters(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    reader = TopicReader(kafka, "targets")
    proc = _start(kafka, tmp_path, "cp")
    try:
        now = wall_ms()
        publish(kafka, "capacity", [(s, _grant(s, now)) for s in SCOPES])
        _wait_targets(reader, "eu1", 1, 60, proc)
        assert _targets(reader, "eu1"), proc.output()[-2000:]
        _feed(kafka, 4 * PERIOD_S)
        reader.poll(1.0)
        for scope in SCOPES:
            targets = _targets(reader, scope)
            epochs = [t.epoch for t in targets]
            assert len(targets) >= 3, f"{scope}: {targets}"
            assert epochs == sorted(set(epochs)), f"{scope} epochs not strictly growing {epochs}"
            assert max(t.rma.budget_units_per_s for t in targets) > 0, targets
        assert {t.ttl_ms for t in _targets(reader, "eu1")} == {5_000}
        assert {t.ttl_ms for t in _targets(reader, "us2")} == {round(US2_TTL_S * 1000)}

        sent_at = time.time()
        publish(kafka, "preemption", [("eu1", PreemptionNotice(
            notice_id="storm", ts_ms=int(sent_at * 1000), region="eu1",
            pool_id="eu1/rank/baseline/a100/opportunistic", deadline_ms=int(sent_at * 1000) + 5000,
            accelerator="a100", accelerator_units=8.0, cpu_units=64.0))])
        fast = reader.wait_for(lambda m: decode(ControlTargets, m.value()).reason == "preemption",
                               timeout_s=10)
        assert fast is not None
        fast_targets = decode(ControlTargets, fast.value())
        print(f"preemption -> clamped targets in {(time.time() - sent_at) * 1000:.0f} ms "
              "(including the reader's poll)")
        assert fast_targets.rma.extra_candidates == 0
        assert fast_targets.sbm.coverage == 0.0

        dead = TopicReader(kafka, "deadletter")
        inputs = ("telemetry", "capacity", "preemption", "outcomes")
        for logical in inputs:
            publish(kafka, logical, [("eu1", b"{not json"), ("eu1", b"\x00\xff garbage")])
        publish(kafka, "telemetry", [("us2", _reports("eu1", now)[0][1])])
        letters: list[DeadLetter] = []
        deadline = time.monotonic() + 30
        while len(letters) < 2 * len(inputs) + 1 and time.monotonic() < deadline:
            letters += [decode(DeadLetter, m.value()) for m in dead.poll(0.5)]
        assert len(letters) == 2 * len(inputs) + 1, proc.output()[-2000:]
        assert {letter.source_topic for letter in letters} == {kafka.topic(t) for t in inputs}
        assert all(letter.offset >= 0 and letter.partition >= 0 for letter in letters)
        reasons = " | ".join(letter.reason for letter in letters)
        assert "malformed JSON" in reasons and "does not match scope" in reasons
        dead.close()
        before = len(_targets(reader, "eu1"))
        _wait_targets(reader, "eu1", before + 2, 10, proc)  # the agents are still alive
        assert len(_targets(reader, "eu1")) >= before + 2
    finally:
        proc.stop()
        reader.close()
    assert proc.alive() is False


def test_rma_rises_under_the_budget_when_fast_and_falls_within_two_periods_when_slow(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    port = free_port()
    reader = TopicReader(kafka, "targets")
    publish(kafka, "capacity", [("eu1", _grant("eu1", wall_ms()))])
    proc = _start(kafka, tmp_path, "cp", metrics_port=port)
    try:
        _wait_targets(reader, "eu1", 1, 60, proc)
        _feed(kafka, 6 * PERIOD_S, ("eu1",), latency_ms=5.0)
        reader.poll(0.5)
        fast, metrics = _targets_and_metrics(reader, "eu1", port)
        extras = [t.rma.extra_candidates for t in fast]
        assert max(extras) > 0 and extras[-1] >= extras[0], extras
        # The budget is spread over the settled request rate (a burst's period does not cut
        # the target; the clients' budget buckets hold the spending within it meanwhile).
        rate = metrics['surplus_control_rma_spread_request_rate{scope="eu1"}']
        assert rate > 0
        last = fast[-1]
        assert last.rma.extra_candidates * rate <= last.rma.budget_units_per_s * 1.01
        assert 'surplus_control_rma_pid_component{scope="eu1",term="i"}' in metrics
        assert any(k.startswith("surplus_control_consumer_lag{") for k in metrics)
        assert metrics['surplus_control_opportunistic_units{resource="a100",scope="eu1"}'] == 8.0

        switched = wall_ms()
        _feed(kafka, 2.5 * PERIOD_S, ("eu1",), latency_ms=400.0)  # p99 far above the SLA
        reader.poll(0.5)
        slow = [t for t in _targets(reader, "eu1") if t.issued_at_ms > switched]
        assert slow, proc.output()[-2000:]
        within_two = slow[:2]
        print(f"RMA: rose to {last.rma.extra_candidates} at p99 ~14 ms; after p99 > SLA: "
              f"{[t.rma.extra_candidates for t in slow]}")
        assert min(t.rma.extra_candidates for t in within_two) < last.rma.extra_candidates
    finally:
        proc.stop()
        reader.close()


def test_kill_9_and_restart_keeps_epoch_growing_without_a_burst(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    reader = TopicReader(kafka, "targets")
    now = wall_ms()
    publish(kafka, "capacity", [("eu1", _grant("eu1", now))])
    first = _start(kafka, tmp_path, "first")
    try:
        _wait_targets(reader, "eu1", 1, 60, first)
        _feed(kafka, 5 * PERIOD_S, ("eu1",))
        reader.poll(0.5)
    finally:
        first.kill()
    before = _targets(reader, "eu1")
    assert len(before) >= 3, first.output()[-2000:]
    second = _start(kafka, tmp_path, "second")
    try:
        _feed(kafka, 2 * PERIOD_S, ("eu1",))
        _wait_targets(reader, "eu1", len(before) + 2, 60, second)
    finally:
        second.stop()
    after = _targets(reader, "eu1")[len(before):]
    assert after, second.output()[-2000:]
    assert after[0].epoch > before[-1].epoch, (before[-1], after[0])
    assert after[0].rma.extra_candidates <= before[-1].rma.extra_candidates
    print(f"restart: epoch {before[-1].epoch} -> {after[0].epoch}, extra candidates "
          f"{before[-1].rma.extra_candidates} -> {after[0].rma.extra_candidates}")
    reader.close()


def test_two_processes_publish_each_scope_once_per_period_and_hand_over(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    reader = TopicReader(kafka, "targets")
    now = wall_ms()
    publish(kafka, "capacity", [(s, _grant(s, now)) for s in SCOPES])
    a = _start(kafka, tmp_path, "a")
    b = _start(kafka, tmp_path, "b")
    try:
        for scope in SCOPES:
            _wait_targets(reader, scope, 1, 90, a, b)
        time.sleep(8)  # let the group settle with both members
        reader.poll(0.5)
        settled = len(reader.messages)
        _feed(kafka, 6 * PERIOD_S)
        reader.poll(0.5)
        window = [decode(ControlTargets, m.value()) for m in reader.messages[settled:]]
        for scope in SCOPES:
            times = sorted(t.issued_at_ms for t in window if t.scope == scope)
            gaps = [b2 - a2 for a2, b2 in itertools.pairwise(times)]
            assert len(times) >= 4, f"{scope}: {times}"
            assert min(gaps) >= PERIOD_S * 1000 * 0.5, f"{scope} published twice: {gaps}"
        b.stop()
        stopped_at = wall_ms()
        _feed(kafka, 8 * PERIOD_S)
        reader.poll(0.5)
        later = [decode(ControlTargets, m.value()) for m in reader.messages]
        for scope in SCOPES:
            times = sorted(t.issued_at_ms for t in later if t.scope == scope)
            assert any(t > stopped_at + 3000 for t in times), f"{scope} lost its owner"
            around = [t for t in times if t > stopped_at - 2000]
            gaps = [y - x for x, y in itertools.pairwise(around)]
            print(f"{scope}: largest gap across the hand-over {max(gaps)} ms")
            # A clean leave costs at most one period without targets (plus scheduling noise):
            # the remaining member hears of the rebalance at its next heartbeat (1 s).
            assert max(gaps) <= 2 * PERIOD_S * 1000 + 500, f"{scope} gap {max(gaps)} ms"
    finally:
        a.stop()
        b.stop()
        reader.close()


def test_partition_count_other_than_the_topics_stops_the_control_plane_at_start(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    proc = Proc(["control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix,
                 "--partitions", "3", "--data-dir", str(tmp_path)], tmp_path / "cp.log")
    assert proc.popen is not None and proc.popen.wait(60) == 1
    assert "has 2 partitions but --partitions is 3" in proc.output()
    proc.stop()
