"""A three-broker cluster loses the leader of the targets and preemption partitions (kill -9)
under load.

Every partition has three replicas and min.insync.replicas 2, and targets and notices are
produced with acks=all and idempotence, so no message a producer was told is written may be
lost, and none may be written twice: the test counts what the control plane (targets) and a
scheduler's producer (notices) got acknowledgements for and reads it all back after the
failover. Baseline keeps being served within the SLA, optional work goes on or resumes, and
the failover is timed: from the kill to a new leader, to the first notice and the first target
acknowledged by it, to the worker holding new targets.

Runs a cluster of its own (three broker JVMs); the session broker is never touched.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import decode, encode
from schemas.contract import ControlTargets, PreemptionNotice
from schemas.kafka_clients import KafkaError, Message, NewTopic
from schemas.kafka_config import KafkaSettings
from schemas.topics import CATALOG, spec
from streams.control.config import RmaConfig
from surplus import localkafka
from surplus.topics import apply_topics, create_topics, replicated
from tests.faults.conftest import Figures
from tests.faults.fleet import Fleet, figures_of
from tests.integration.fleet import REGION
from tests.integration.harness import TopicReader

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]

SLA_P99_MS = RmaConfig().sla_p99_ms
BROKERS = 3
VICTIM = 2  # the node made leader of every targets and preemption partition, then killed
PARTITIONS = 2
#: Notices go to a region no replica serves: they travel the real path (producer, brokers,
#: the control plane's fast path, every worker's preemption consumer) and reclaim nothing.
NOTICE_REGION = "zz9"
NOTICE_EVERY_S = 0.1
#: The requests' deadline (the fleet's load runner's default).
DEADLINE_MS = 250.0


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[tuple[KafkaSettings, localkafka.ClusterInfo]]:
    """Three local nodes, the catalog applied (replication factor 3), and node `VICTIM` first
    replica, so leader, of every partition of targets and preemption."""
    localkafka.fetch_jars()
    data_dir = tmp_path / "cluster"
    info, _ = localkafka.up_cluster(BROKERS, port=localkafka.free_port_block(2 * BROKERS),
                                    data_dir=data_dir)
    try:
        kafka = KafkaSettings(bootstrap=info.bootstrap, prefix=f"f{uuid.uuid4().hex[:6]}.")
        _lead_scope_topics_from(kafka, VICTIM)
        report = apply_topics(kafka.confluent(), kafka.prefix, partitions_override=PARTITIONS)
        assert report.ok and report.replication_factor == BROKERS, report
        yield kafka, info
    finally:
        localkafka.down_cluster(data_dir)


def _lead_scope_topics_from(kafka: KafkaSettings, leader: int) -> None:
    """Create targets and preemption with `leader` as the preferred replica of each partition
    (the rest of the catalog is laid out by the cluster)."""
    others = [n for n in range(1, BROKERS + 1) if n != leader]
    layout = [[leader, *others], [leader, *reversed(others)]][:PARTITIONS]
    topics = [NewTopic(kafka.topic(logical), num_partitions=PARTITIONS,
                       replica_assignment=layout,
                       config=replicated(spec(logical).config(), BROKERS))
              for logical in ("targets", "preemption")]
    create_topics(kafka_clients.admin(kafka), topics, timeout_s=30)


class NoticeStream:
    """A scheduler's notices, one every `NOTICE_EVERY_S`, produced as `surplus scheduler` does
    (`KafkaSettings.producer()`: acks=all, idempotence); each send and acknowledgement timed
    (monotonic seconds)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self.producer = kafka_clients.producer(kafka, **{"linger.ms": 0,
                                                         "client.id": "fault-scheduler"})
        self.sent: dict[str, float] = {}
        self.acked: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self._lock = threading.Lock()  # the test reads what the sending thread writes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-notices", daemon=True)

    def start(self) -> NoticeStream:
        self.producer.list_topics(timeout=10)
        self._thread.start()
        return self

    def stop(self, flush_s: float = 60.0) -> None:
        """Stop sending and wait for every notice's answer (ack or error); again: no-op."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(10)
        self.producer.flush(flush_s)

    def _run(self) -> None:
        n, next_at = 0, time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() >= next_at:
                n += 1
                next_at += NOTICE_EVERY_S
                self._send(f"failover-{n}")
            self.producer.poll(0.005)

    def _send(self, notice_id: str) -> None:
        now = wall_ms()
        notice = PreemptionNotice(notice_id=notice_id, ts_ms=now, region=NOTICE_REGION,
                                  pool_id=f"{NOTICE_REGION}/rank/baseline/a100/opportunistic",
                                  deadline_ms=now + 30_000, accelerator="a100")
        with self._lock:
            self.sent[notice_id] = time.monotonic()
        kafka_clients.produce_waiting(
            self.producer, self.kafka.topic("preemption"), key=NOTICE_REGION.encode(),
            value=encode(notice),
            on_delivery=lambda err, _msg: self._delivered(notice_id, err))

    def _delivered(self, notice_id: str, err: KafkaError | None) -> None:
        with self._lock:
            if err is None:
                self.acked[notice_id] = time.monotonic()
            else:
                self.failed[notice_id] = str(err)

    def first_acked_after(self, t: float) -> float | None:
        """When the first notice sent after `t` was acknowledged (by a live leader: the old
        one was dead when it was sent)."""
        with self._lock:
            times = [self.acked[i] for i, sent in self.sent.items()
                     if sent > t and i in self.acked]
        return min(times) if times else None


def _leaders(kafka: KafkaSettings, admin: kafka_clients.AdminClient) -> dict[str, set[int]]:
    """Leaders of the targets and preemption partitions, as the cluster tells them."""
    out: dict[str, set[int]] = {}
    for logical in ("targets", "preemption"):
        topic = kafka.topic(logical)
        meta = admin.list_topics(topic, timeout=2).topics[topic]
        out[logical] = {p.leader for p in meta.partitions.values()}
    return out


def _acked_targets(fleet: Fleet) -> tuple[dict[str, int], dict[str, float]]:
    """Per scope: the highest epoch the control plane got an acknowledgement for, and its
    acknowledged / failed counts."""
    samples = fleet.controls[0].metrics()
    epochs, counts = {}, {}
    for key, value in samples.items():
        if key.startswith("surplus_control_targets_acked_epoch{"):
            epochs[key.split('scope="', 1)[1].split('"', 1)[0]] = int(value)
        elif key.startswith("surplus_control_targets_delivered_total{"):
            counts[key.split("{", 1)[1].rstrip("}")] = value
    return epochs, counts


def _read_back(kafka: KafkaSettings, logical: str, complete: object,
               timeout_s: float = 60.0) -> list[Message]:
    """Every message of a topic from the beginning, read until `complete(messages)` holds (or
    the timeout: the assertions then say what is missing)."""
    reader = TopicReader(kafka, logical)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            reader.poll(0.5)
            if complete(reader.messages):  # type: ignore[operator]
                break
        return list(reader.messages)
    finally:
        reader.close()


def _longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch within [start, end] with none of `times` in it."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in itertools.pairwise(points))


def test_leader_broker_killed_under_load_loses_no_acknowledged_notice_or_target(
        own_cluster: tuple[KafkaSettings, localkafka.ClusterInfo], tmp_path: Path,
        figures: Figures, stopping: list[Fleet]) -> None:
    kafka, cluster = own_cluster
    survivors = ",".join(n.bootstrap for n in cluster.nodes if n.node_id != VICTIM)
    admin = kafka_clients.admin({"bootstrap.servers": survivors, "socket.timeout.ms": 1000})
    assert _leaders(kafka, admin) == {"targets": {VICTIM}, "preemption": {VICTIM}}
    fleet = Fleet(tmp_path, kafka, baseline=1, powerful=1, ttl_s=6.0)
    stopping.append(fleet)
    fleet.start()
    warm = fleet.warm_up(timeout_s=90)
    # Every topic of the deployment, the control plane's ticks and state included, has a
    # replica on each node.
    topics = {name: {len(p.replicas) for p in t.partitions.values()}
              for name, t in admin.list_topics(timeout=10).topics.items()
              if name.startswith(kafka.prefix)}
    # The catalog's topics and three of the control plane's own (its state's changelog, the
    # label join's pending changelog, and one of Faust's).
    assert len(topics) == len(CATALOG) + 3, topics
    assert set(map(frozenset, topics.values())) == {frozenset({BROKERS})}, topics
    notices = NoticeStream(kafka).start()
    try:
        _fail_over_and_check(fleet, kafka, survivors, admin, notices, warm, figures,
                             cluster.node(VICTIM).pid)
    finally:
        notices.stop(flush_s=0)
    # The killed node comes back with its data: `kafka up --brokers 3` starts what is missing.
    again, started = localkafka.up_cluster(BROKERS, port=cluster.node(1).port,
                                           data_dir=cluster.data_dir)
    assert started and not again.missing and len(again.nodes) == BROKERS, again
    figures.add("killed node serving again after `kafka up` s", round(again.started_in_s or 0, 1))


def _fail_over_and_check(fleet: Fleet, kafka: KafkaSettings, survivors: str,
                         admin: kafka_clients.AdminClient, notices: NoticeStream, warm: float,
                         figures: Figures, victim_pid: int) -> None:
    load = fleet.runner
    time.sleep(5)
    killed_at, kill_t = time.monotonic(), load.now()
    os.killpg(victim_pid, signal.SIGKILL)
    # What the dead leader had acknowledged (an answer on its way as it died included): no
    # new leader can be elected within the fraction of a second this waits.
    time.sleep(0.2)
    epochs_before, _ = _acked_targets(fleet)
    worker_epoch_before = fleet.worker_metric("b1", "surplus_worker_targets_epoch")
    times = _time_failover(fleet, kafka, admin, notices, killed_at, epochs_before,
                           worker_epoch_before)
    recovered_t = load.now()

    def resumed() -> bool:
        fleet.assert_alive()
        recent = [s for s in load.samples if s.t >= recovered_t]
        return (any(s.optional_scored > 0 and s.model == "baseline" for s in recent)
                and any(s.model == "powerful" for s in recent))

    resume_s = fleet.wait_for("optional work after the failover", resumed, 60)
    time.sleep(5)
    fleet.assert_alive()
    notices.stop()
    acked_epochs, delivered = _acked_targets(fleet)
    summary = load.client_summary()
    fleet.stop()

    # Read back after the failover, by a consumer that knows only the surviving nodes.
    back = KafkaSettings(bootstrap=survivors, prefix=kafka.prefix)
    read_notices = _read_back(back, "preemption", lambda msgs: set(notices.acked) <= {
        decode(PreemptionNotice, m.value() or b"").notice_id for m in msgs})
    notice_ids = Counter(n.notice_id for n in (decode(PreemptionNotice, m.value() or b"")
                                                for m in read_notices)
                         if n.notice_id.startswith("failover-"))
    lost_notices = sorted(set(notices.acked) - set(notice_ids))

    def targets_of(msgs: list[Message]) -> Counter[tuple[str, int]]:
        return Counter((t.scope, t.epoch) for t in (decode(ControlTargets, m.value() or b"")
                                                     for m in msgs))

    def all_acked(msgs: list[Message]) -> bool:
        seen = targets_of(msgs)
        return all((scope, e) in seen for scope, top in acked_epochs.items()
                   for e in range(1, top + 1))

    read_targets = targets_of(_read_back(back, "targets", all_acked))
    lost_targets = [(scope, e) for scope, top in acked_epochs.items()
                    for e in range(1, top + 1) if (scope, e) not in read_targets]

    before = load.window(warm, kill_t)
    failover = load.window(kill_t, recovered_t + resume_s)
    after = load.window(recovered_t + resume_s)
    whole = load.window(warm)
    optional_t = [s.t for s in load.samples if s.optional_scored > 0 and s.model == "baseline"]
    figures.add("cluster", f"{BROKERS} brokers, replication factor 3, min.insync.replicas 2; "
                           f"node {VICTIM} led every targets and preemption partition")
    figures.add("before", figures_of(before))
    figures.add("failover (kill -> optional work seen again)", figures_of(failover))
    figures.add("after", figures_of(after))
    figures.add("failover s (from the kill)", times)
    # Where a slow failover's tail sits (two CI rehearsals read a ranking p99 of 106 and 359
    # ms here; runs alone 37-56 ms, and once over 100): the slowest ranking requests, from the
    # kill, with the extras they carried; a stall shows as several ending together.
    slowest = sorted((s for s in failover.samples if failover.t0 <= s.t < failover.t1
                      and s.served and s.routed != "powerful"),
                     key=lambda s: -s.latency_ms)[:6]
    figures.add("slowest ranking requests in the failover (start s from the kill, end s, ms, "
                "extras scored)", [[round(s.t - kill_t, 3), round(s.end_t - kill_t, 3),
                                    round(s.latency_ms, 1), s.optional_scored] for s in slowest])
    figures.add("longest stretch without RMA extras around the kill s",
                round(_longest_gap(optional_t, kill_t - 1.0, load.window(0).t1), 1))
    figures.add("notices: sent / acked / failed / read back / lost / duplicated", [
        len(notices.sent), len(notices.acked), len(notices.failed), len(notice_ids),
        len(lost_notices), sum(c - 1 for c in notice_ids.values())])
    figures.add("targets acked (highest epoch per scope)", acked_epochs)
    figures.add("targets delivered by outcome", delivered)
    figures.add("targets read back / lost / duplicated", [
        len(read_targets), len(lost_targets), sum(c - 1 for c in read_targets.values())])
    figures.add("client decisions", summary["decisions"])

    # Nothing acknowledged is lost, nothing is written twice.
    assert notices.acked and not lost_notices, lost_notices[:10]
    assert not notices.failed, list(notices.failed.items())[:5]
    assert all(c == 1 for c in notice_ids.values()), notice_ids.most_common(3)
    assert acked_epochs.get(REGION, 0) > epochs_before.get(REGION, 0)
    assert not lost_targets, lost_targets[:10]
    assert all(c == 1 for c in read_targets.values()), read_targets.most_common(3)
    # Baseline never noticed: nothing lost, and through the failover the SLA as the product
    # states it (the demo's report and the simulator judge it so): the requests routed to the
    # ranking pool within the ranking SLA, those routed to the powerful model within their
    # deadline. A powerful replica whose targets lapsed during the election refuses whole
    # requests (503) and they fall back; a run in CI measured 5 such fallbacks up to 205 ms
    # whose end-to-end latency, counted against the ranking SLA, read as a p99 of 127 ms.
    assert whole.lost == {} and whole.served == whole.sent, whole.lost
    assert failover.ranking_p99_ms <= SLA_P99_MS, failover.ranking_p99_ms
    assert failover.routed_powerful_max_ms <= DEADLINE_MS, failover.routed_powerful_max_ms
    # Optional work goes on after the failover.
    assert after.optional_done > 0 and after.served_powerful > 0


def _time_failover(fleet: Fleet, kafka: KafkaSettings, admin: kafka_clients.AdminClient,
                   notices: NoticeStream,
                   killed_at: float, epochs_before: dict[str, int],
                   worker_epoch_before: float, timeout_s: float = 120.0) -> dict[str, float]:
    """Seconds from the kill until: a new leader for every targets and preemption partition,
    the first notice sent after the kill acknowledged, the first new target acknowledged to
    the control plane, and the worker holding a newer target than before."""
    found: dict[str, float] = {}
    deadline = killed_at + timeout_s
    while len(found) < 4 and time.monotonic() < deadline:
        fleet.assert_alive()
        now = time.monotonic()
        if "new leader" not in found:
            try:
                leaders = _leaders(kafka, admin)
            except Exception:
                leaders = {}
            if leaders and all(VICTIM not in ls and -1 not in ls for ls in leaders.values()):
                found["new leader"] = now - killed_at
        acked = notices.first_acked_after(killed_at)
        if "first notice acked" not in found and acked is not None:
            found["first notice acked"] = acked - killed_at
        if "first target acked" not in found:
            epochs, _ = _acked_targets(fleet)
            if epochs.get(REGION, 0) > epochs_before.get(REGION, 0):
                found["first target acked"] = now - killed_at
        if "targets on the worker" not in found and fleet.worker_metric(
                "b1", "surplus_worker_targets_epoch") > worker_epoch_before:
            found["targets on the worker"] = now - killed_at
        time.sleep(0.1)
    assert len(found) == 4, f"failover not complete within {timeout_s}s: {found}"
    return {k: round(v, 2) for k, v in found.items()}
