"""The label join on its stores: the same rule in RAM and on RocksDB, and what the disk adds.

Pins: the join's fates (joined, late, duplicate, orphan, expiry, eviction) are the same on the
in-process store and on the disk store; a disk reopened after its process died holds every
pending decision, and their labels join; a disk rebuilt from the changelog alone (a partition
moved) holds the same entries; a restore from the last delivered offset reads only what came
after; a changelog record that is not an entry is skipped; on disk, decisions do not grow the
Python heap; the changelog is kept longer than any scope's join could want an entry; one
changelog record a partition carries what an input message changed.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from schemas.contract import DECISION_VERSION, OutcomeLabel, RoutingOutcome
from schemas.kafka_config import KafkaSettings
from streams.agents.pending import (
    PendingChangelog,
    PendingDisk,
    changelog_config,
    decode_batch,
    decode_entry,
    encode_entry,
)
from streams.control.config import ControlConfig, LabelsConfig
from streams.control.labels import AttributionJoin
from streams.control.pending import MemoryPendingStore, Pending, PendingStore
from tests.unit.control.test_labels import check_every_fate

SCOPE = "eu1"
MIN = 60_000


def decision(rid: str, ts: int = 0, value: float | None = None) -> RoutingOutcome:
    return RoutingOutcome(v=DECISION_VERSION, ts_ms=ts, scope=SCOPE, request_id=rid,
                          segment="s", model="powerful", propensity=0.5, extra=4, value=value)


def label(rid: str, value: float = 1.0) -> OutcomeLabel:
    return OutcomeLabel(ts_ms=0, scope=SCOPE, request_id=rid, value=value)


class Changelog:
    """A changelog topic in a list: (partition, key, value) in write order."""

    def __init__(self) -> None:
        self.records: list[tuple[int, bytes, bytes]] = []

    def __call__(self, partition: int, key: bytes, value: bytes) -> None:
        self.records.append((partition, key, value))


StoreFor = Callable[[], PendingStore]


@pytest.fixture(params=["memory", "rocksdb"])
def store_for(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFor:
    if request.param == "memory":
        return MemoryPendingStore
    disk = PendingDisk(tmp_path / "pending", Changelog())
    request.addfinalizer(disk.close)
    return lambda: disk.store(SCOPE, 3)


def test_every_fate_is_the_same_on_either_store(store_for: StoreFor) -> None:
    check_every_fate(AttributionJoin(LabelsConfig(window_s=600), store_for()))


def test_the_cap_evicts_the_oldest_first_on_either_store(store_for: StoreFor) -> None:
    join = AttributionJoin(LabelsConfig(window_s=600, max_pending=100), store_for())
    for i in range(250):
        join.on_decision(decision(f"r{i}"), i)
    assert len(join) == 100 and join.counts["evicted"] == 150
    assert join.on_label(label("r149"), 300) is None                 # evicted: an orphan
    assert join.on_label(label("r150"), 300) is not None             # the oldest kept
    join.expire(200 + 20 * MIN)                                       # r150..r199 expire
    assert len(join) == 50 and join.counts["unlabelled"] == 49        # r150 had joined


def test_a_disk_reopened_after_its_process_died_joins_every_pending_decision(
        tmp_path: Path) -> None:
    disk = PendingDisk(tmp_path / "pending", Changelog())
    join = AttributionJoin(LabelsConfig(window_s=600), disk.store(SCOPE, 3))
    for i in range(500):
        join.on_decision(decision(f"r{i}"), i)
    assert join.on_label(label("r0"), 1000) is not None
    disk.close()                          # what a kill -9 leaves: the store's files, no goodbye

    again = PendingDisk(tmp_path / "pending")
    after = AttributionJoin(LabelsConfig(window_s=600), again.store(SCOPE, 3))
    assert len(after) == 500
    assert after.on_label(label("r0"), 2000) is None                 # joined before: duplicate
    assert all(after.on_label(label(f"r{i}"), 2000) is not None for i in range(1, 500))
    assert after.counts["joined"] == 499 and after.counts["orphan"] == 0
    after.expire(500 + 20 * MIN)                                       # and expiry still works
    assert len(after) == 0 and after.counts["unlabelled"] == 0
    again.close()


def test_a_disk_rebuilt_from_the_changelog_holds_the_same_entries(tmp_path: Path) -> None:
    log = Changelog()
    old = PendingDisk(tmp_path / "old", log)
    join = AttributionJoin(LabelsConfig(window_s=600), old.store(SCOPE, 3))
    for i in range(300):
        join.on_decision(decision(f"r{i}", i), 10 + i)
    for i in range(0, 300, 3):
        join.on_label(label(f"r{i}"), 400)
    assert len(log.records) == 300 + 100                              # one per change
    assert {p for p, _, _ in log.records} == {3}                      # the scope's partition

    moved = PendingDisk(tmp_path / "moved")                            # another machine
    for partition, key, value in log.records:
        moved.apply(partition, key, value)
    rebuilt = AttributionJoin(LabelsConfig(window_s=600), moved.store(SCOPE, 3))
    assert len(rebuilt) == 300
    for i in range(300):
        entry = rebuilt.store.get(f"r{i}")
        assert entry == old.store(SCOPE, 3).get(f"r{i}")
        assert entry is not None and (entry.decision is None) == (i % 3 == 0)
    assert rebuilt.on_label(label("r1", 4.0), 500) == decision("r1", 1, value=4.0)
    rebuilt.expire(309 + 20 * MIN + 1)                                 # the index was rebuilt too
    assert len(rebuilt) == 0
    old.close()
    moved.close()


def test_a_restore_reads_on_from_the_last_offset_the_disk_holds(tmp_path: Path) -> None:
    disk = PendingDisk(tmp_path / "pending", Changelog())
    assert disk.offset(3) is None                                      # a new disk: from the start
    disk.delivered(3, 41)
    disk.delivered(3, 40)                                              # reports out of order
    assert disk.offset(3) is None                                      # not yet checkpointed
    disk.checkpoint()
    assert disk.offset(3) == 41 and disk.offset(2) is None
    disk.restored(3, 57)
    assert disk.offset(3) == 57
    disk.close()
    assert PendingDisk(tmp_path / "pending").offset(3) == 57


def test_two_processes_on_one_data_dir_each_get_a_disk_and_a_lone_restart_finds_its_own(
        tmp_path: Path) -> None:
    # RocksDB locks its directory: the second control plane on one --data-dir crashed on it.
    first = PendingDisk(tmp_path / "pending")
    second = PendingDisk(tmp_path / "pending")
    first.restored(3, 10)
    second.restored(5, 20)
    assert (first.offset(3), first.offset(5)) == (10, None)
    assert (second.offset(3), second.offset(5)) == (None, 20)
    first.close()
    second.close()
    assert PendingDisk(tmp_path / "pending").offset(3) == 10          # slot-0 again


def test_a_changelog_record_that_is_not_an_entry_is_skipped(tmp_path: Path) -> None:
    disk = PendingDisk(tmp_path / "pending")
    key = len(SCOPE).to_bytes(2, "big") + SCOPE.encode()
    disk.apply(3, key + b"bad", b"not an entry")
    disk.apply(3, key + b"worse", b"w" + (5).to_bytes(8, "big") + b"\xc1")
    disk.apply(3, key + b"good", encode_entry(Pending(5, decision("good"))))
    store = disk.store(SCOPE, 3)
    assert len(store) == 1 and "good" in store and "bad" not in store
    disk.apply(3, key + b"good", None)                                 # a tombstone deletes it
    assert len(disk.store(SCOPE, 3)) == 0
    with pytest.raises(ValueError, match="not a pending entry"):
        decode_entry(b"x")
    disk.close()


def test_scopes_on_one_disk_keep_their_own_entries(tmp_path: Path) -> None:
    disk = PendingDisk(tmp_path / "pending")
    a, b = disk.store("eu1", 3), disk.store("eu10", 3)                # one a prefix of the other
    a.add("r", Pending(1, decision("r")))
    b.add("r", Pending(2, None))
    assert a.get("r") == Pending(1, decision("r")) and b.get("r") == Pending(2, None)
    assert a.drop_older(2) == 1 and len(a) == 0 and len(b) == 1
    disk.close()


def test_decisions_held_on_disk_do_not_grow_the_python_heap(tmp_path: Path) -> None:
    n = 20_000

    def peak_mb(store: PendingStore) -> float:
        join = AttributionJoin(LabelsConfig(window_s=600, max_pending=10 * n), store)
        tracemalloc.start()
        for i in range(n):
            join.on_decision(decision(f"request-{i}"), i)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(join) == n
        return peak / 1e6

    disk = PendingDisk(tmp_path / "pending")
    in_ram, on_disk = peak_mb(MemoryPendingStore()), peak_mb(disk.store(SCOPE, 0))
    assert in_ram > 5.0                         # ~0.5 KB a decision in the process
    assert on_disk < 1.0, (in_ram, on_disk)     # RocksDB's memory is its own, and bounded
    disk.close()


def test_the_changelog_outlives_two_of_the_longest_window_of_any_scope() -> None:
    config = ControlConfig(labels=LabelsConfig(window_s=600),
                           scopes={"us2": {"labels": {"window_s": 900.0}}})
    assert changelog_config(config) == {"cleanup.policy": "delete",
                                        "retention.ms": str(3 * 900_000),
                                        "segment.ms": str(900_000)}


class FakeProducer:
    """What `PendingChangelog` asks of librdkafka's producer, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes]] = []

    def produce(self, topic: str, value: bytes, partition: int, on_delivery: object) -> None:
        self.sent.append((partition, value))

    def poll(self, timeout: float) -> int:
        return 0


def test_one_changelog_record_carries_every_entry_a_message_changed_on_a_partition(
        tmp_path: Path) -> None:
    log = PendingChangelog(KafkaSettings(bootstrap="127.0.0.1:9"), "pending", tmp_path / "p")
    producer = FakeProducer()
    log._producer = producer  # type: ignore[assignment]
    eu1, us2 = log.disk.store(SCOPE, 3), log.disk.store("us2", 1)
    for i in range(100):
        eu1.add(f"r{i}", Pending(i, decision(f"r{i}")))
    us2.add("x", Pending(0, None))
    log.flush()
    assert sorted(p for p, _ in producer.sent) == [1, 3]             # one record a partition
    log.flush()
    assert len(producer.sent) == 2                                    # nothing new: no record

    moved = PendingDisk(tmp_path / "moved")
    for partition, value in producer.sent:
        for key, entry in decode_batch(value):
            moved.apply(partition, key, entry)
    assert len(moved.store(SCOPE, 3)) == 100
    assert moved.store(SCOPE, 3).get("r7") == Pending(7, decision("r7"))
    assert moved.store("us2", 1).get("x") == Pending(0, None)
    with pytest.raises(ValueError, match="not a batch"):
        decode_batch(b"junk")
    moved.close()
    log.disk.close()
