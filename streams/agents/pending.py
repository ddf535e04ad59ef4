"""The label join's pending decisions on disk: RocksDB (``rocksdict``) and a changelog topic.

At ad scale the decisions waiting for their labels outgrow a process's RAM (two attribution
windows of logged decisions: 10 min at 10,000 a second is 12 million), and in RAM a kill -9
turned a window of joins into orphans. Here they live in one RocksDB per control-plane process
under its ``--data-dir``, whose memory is bounded by its own settings (``DiskSettings``)
whatever the rate, and every entry written is also produced to a changelog topic partitioned
like the inputs, in one record a partition for each input message (``PendingChangelog``):

- killed and restarted on the same disk, a process finds its entries where it left them
  (RocksDB's write-ahead log survives the process) and reads the changelog only from the last
  offset it knows was delivered, a tick's worth;
- a partition that moves to a process without its disk is rebuilt from the changelog.

This is what a Faust Table on RocksDB does; it is done by hand for the reason the scope
changelog is (`streams.agents.control`): a Table in the app shares the agents' consumer and
cost ~15% of ingest, a Table writes a record a key where a client's batch changes hundreds of
entries, and a pending decision needs an order by arrival that a Table's store has no index
for. Entries dropped (expired, evicted) are not written to the changelog: the topic's
retention (three windows, ``changelog_config``) drops them, and one read back from before its
drop is dropped again by the join's expiry at the next tick.

The store's keys (raw bytes, one namespace per partition and scope)::

    d | partition (2) | len(scope) (2) | scope | request id            -> entry
    t | partition (2) | len(scope) (2) | scope | arrived ms (8) | rid -> b""   (arrival index)
    o | partition (2)                                                -> changelog offset (8)

An entry is ``w`` + arrived ms (8) + the decision (msgpack) while it waits, ``j`` + arrived ms
once joined. A changelog record is a msgpack array of (key, entry) pairs, the key the ``d``
key's tail from the scope's length on, written to the scope's partition.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch, WriteOptions

from schemas import kafka_clients
from schemas.contract import RoutingOutcome
from schemas.kafka_clients import KafkaError, Message, Producer
from schemas.kafka_config import KafkaSettings
from streams.agents.changelog import replay_changelog
from streams.control.config import ControlConfig
from streams.control.pending import Pending

log = logging.getLogger(__name__)

Emit = Callable[[int, bytes, bytes], None]
"""Write one changelog record: partition, key, value."""

_WAITING, _JOINED = b"w", b"j"
_encode = msgspec.msgpack.Encoder().encode
_decode_decision = msgspec.msgpack.Decoder(RoutingOutcome).decode
#: Past any arrival time: the index of an empty store has nothing older than this.
_NEVER = 1 << 62


def encode_entry(entry: Pending) -> bytes:
    """The stored and changelogged bytes of an entry (``w``/``j``, arrival, decision)."""
    head = entry.arrived_ms.to_bytes(8, "big")
    if entry.decision is None:
        return _JOINED + head
    return _WAITING + head + _encode(entry.decision)


def decode_entry(raw: bytes) -> Pending:
    """The inverse of ``encode_entry``; raises ``ValueError`` on bytes it did not write."""
    kind, arrived = raw[:1], int.from_bytes(raw[1:9], "big")
    if len(raw) < 9 or kind not in (_WAITING, _JOINED):
        raise ValueError(f"not a pending entry: {raw[:16]!r}")
    if kind == _JOINED:
        return Pending(arrived, None)
    try:
        return Pending(arrived, _decode_decision(raw[9:]))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"pending entry's decision does not decode: {exc}") from exc


def _part(partition: int) -> bytes:
    return partition.to_bytes(2, "big")


def _scope_key(scope: str) -> bytes:
    raw = scope.encode()
    return len(raw).to_bytes(2, "big") + raw


class DiskSettings(msgspec.Struct, frozen=True):
    """RocksDB's memory, which is what bounds the join's RSS (RocksDB's own defaults are
    64 MB a memtable, two of them). A pending decision lives a second or two (its label
    comes, and it is deleted), so the memtables hold the recent past and fill at the decision
    rate; smaller ones bound RSS lower and cost CPU in flushes (`surplus bench fleet`,
    docs/benchmarks.md).

    :param write_buffer_mb: one memtable; at most two (one being flushed).
    :param block_cache_mb: the read cache shared by the store's tables.
    """

    write_buffer_mb: int = 16
    block_cache_mb: int = 32


#: Databases a data directory may hold for control planes sharing it (``PendingDisk``).
MAX_SLOTS = 16


class PendingDisk:
    """One process's RocksDB of pending decisions, and the offsets its changelog reached.

    Thread-safety: the control plane's event loop calls everything but ``apply`` and
    ``restored`` (run in a thread while the partition's agents wait for it) and ``delivered``
    (the producer's delivery callback, served on the loop by ``poll``); the offsets are
    guarded by a lock.

    :param path: the database's directory (created if missing).
    :param emit: writes a changelog record (partition, key, value); None: no changelog.
    :param settings: RocksDB's memory.
    """

    def __init__(self, path: Path, emit: Emit | None = None,
                 settings: DiskSettings | None = None) -> None:
        self.path = path
        self.settings = settings or DiskSettings()
        self.emit = emit
        self._db: Rdict | None = None
        self._lock = threading.Lock()
        self._delivered: dict[int, int] = {}

    @property
    def db(self) -> Rdict:
        """The database, opened on first use (an app built but never run holds no lock)."""
        if self._db is None:
            options = Options(raw_mode=True)
            options.create_if_missing(True)
            options.set_write_buffer_size(self.settings.write_buffer_mb << 20)
            options.set_max_write_buffer_number(2)
            table = BlockBasedOptions()
            table.set_block_cache(Cache(self.settings.block_cache_mb << 20))
            options.set_block_based_table_factory(table)
            db = self._open_free_slot(options)
            # Not synced: a process killed keeps what it wrote (the OS has it); a machine lost
            # is what the changelog is for.
            db.set_write_options(WriteOptions())
            self._db = db
        return self._db

    def _open_free_slot(self, options: Options) -> Rdict:
        """The first database under ``path`` (``slot-0``, ``slot-1``, ...) no other process
        holds. RocksDB locks its directory, and two control planes may be started with one
        ``--data-dir`` on a host (the default, from one working directory): the second
        crashed on the lock at its first assignment. A process restarted alone finds its
        ``slot-0`` again; each slot is a whole disk (entries and the offsets they reached), so
        which one a process gets never mixes two, and the changelog fills in the rest."""
        for slot in range(MAX_SLOTS):
            where = self.path / f"slot-{slot}"
            where.mkdir(parents=True, exist_ok=True)
            try:
                return Rdict(str(where), options)
            except Exception as exc:  # rocksdict raises a bare Exception on an IO error
                if "lock" not in str(exc).lower():
                    raise
                log.info("pending decisions: %s is held by another process", where)
        raise RuntimeError(f"pending decisions: all {MAX_SLOTS} databases under {self.path} "
                           "are held by other processes; give this one its own --data-dir")

    def store(self, scope: str, partition: int) -> RocksPendingStore:
        """The store of one scope (its entries counted now: a walk of its index)."""
        return RocksPendingStore(self, scope, partition)

    # -- the changelog ----------------------------------------------------------------------

    def offset(self, partition: int) -> int | None:
        """The last changelog offset of `partition` known to be in this database."""
        raw = self.db.get(b"o" + _part(partition))
        return None if raw is None else int.from_bytes(raw, "big", signed=True)

    def delivered(self, partition: int, offset: int) -> None:
        """A changelog record of ours reached the broker (its entry was written first)."""
        with self._lock:
            if offset > self._delivered.get(partition, -1):
                self._delivered[partition] = offset

    def checkpoint(self) -> None:
        """Record the delivered offsets: a restart on this disk reads the changelog from
        there on (called each tick; between two, a restart re-reads a tick's records)."""
        with self._lock:
            delivered, self._delivered = self._delivered, {}
        for partition, offset in delivered.items():
            self._set_offset(partition, offset)

    def _set_offset(self, partition: int, offset: int) -> None:
        self.db.put(b"o" + _part(partition), offset.to_bytes(8, "big", signed=True))

    def apply(self, partition: int, key: bytes, value: bytes | None) -> None:
        """One changelog record read back: the entry as its writer last had it. A record
        that is not an entry is skipped with a warning (a restore never stops on one)."""
        if value is None:
            self._delete(partition, key)
            return
        try:
            decode_entry(value)
        except ValueError as exc:
            log.warning("pending changelog record of partition %d skipped: %s", partition, exc)
            return
        data = b"d" + _part(partition) + key
        old = self.db.get(data)
        if old is not None and old[1:9] != value[1:9]:
            self.db.delete(self._index_key(partition, key, old[1:9]))
        if old is None or old[1:9] != value[1:9]:
            self.db.put(self._index_key(partition, key, value[1:9]), b"")
        self.db.put(data, value)

    def restored(self, partition: int, offset: int) -> None:
        """The changelog of `partition` was read up to `offset` (inclusive)."""
        self._set_offset(partition, offset)

    def _delete(self, partition: int, key: bytes) -> None:
        data = b"d" + _part(partition) + key
        old = self.db.get(data)
        if old is not None:
            self.db.delete(data)
            self.db.delete(self._index_key(partition, key, old[1:9]))

    @staticmethod
    def _index_key(partition: int, key: bytes, arrived: bytes) -> bytes:
        n = 2 + int.from_bytes(key[:2], "big")
        return b"t" + _part(partition) + key[:n] + arrived + key[n:]

    def close(self) -> None:
        if self._db is not None:
            self.checkpoint()
            self._db.close()
            self._db = None


class RocksPendingStore:
    """``PendingStore`` (`streams.control.pending`) of one scope in a ``PendingDisk``.

    Its length is counted at construction and kept here; the oldest arrival is cached, so the
    join's check for expired entries on every decision reads no disk until one is due.
    """

    def __init__(self, disk: PendingDisk, scope: str, partition: int) -> None:
        self._db = disk.db
        self._emit = disk.emit
        self._partition = partition
        self._name = _scope_key(scope)
        self._data = b"d" + _part(partition) + self._name
        self._index = b"t" + _part(partition) + self._name
        #: Everything that arrived before this was dropped: index reads start here, past the
        #: tombstones of what was dropped.
        self._floor = 0
        self._oldest: int | None = None
        self._count = sum(1 for _ in self._walk())

    def __len__(self) -> int:
        return self._count

    def __contains__(self, request_id: str) -> bool:
        return self._db.get(self._data + request_id.encode()) is not None

    def get(self, request_id: str) -> Pending | None:
        raw = self._db.get(self._data + request_id.encode())
        return None if raw is None else decode_entry(raw)

    def add(self, request_id: str, entry: Pending) -> None:
        rid = request_id.encode()
        value = encode_entry(entry)
        # The entry and its index in one write: atomic (an entry without its index would never
        # expire), and one write-ahead-log append where two puts cost two.
        batch = WriteBatch(raw_mode=True)
        batch.put(self._index + value[1:9] + rid, b"")
        batch.put(self._data + rid, value)
        self._db.write(batch)
        self._count += 1
        if entry.arrived_ms < self._floor:  # a clock that stepped back: walk from here
            self._floor = entry.arrived_ms
        if self._oldest is not None and entry.arrived_ms < self._oldest:
            self._oldest = entry.arrived_ms
        if self._emit is not None:
            self._emit(self._partition, self._name + rid, value)

    def replace(self, request_id: str, entry: Pending) -> None:
        rid = request_id.encode()
        value = encode_entry(entry)
        self._db.put(self._data + rid, value)
        if self._emit is not None:
            self._emit(self._partition, self._name + rid, value)

    def drop_older(self, cutoff_ms: int) -> int:
        if self._oldest is not None and self._oldest >= cutoff_ms:
            return 0
        waiting = 0
        oldest = _NEVER
        for arrived, key in self._walk():
            if arrived >= cutoff_ms:
                oldest = arrived
                break
            waiting += self._drop(key)
        self._oldest = oldest
        self._floor = max(self._floor, min(cutoff_ms, oldest))
        return waiting

    def drop_oldest(self) -> bool | None:
        for arrived, key in self._walk():
            self._floor = arrived
            self._oldest = None
            return self._drop(key)
        self._oldest = _NEVER
        return None

    def _drop(self, index_key: bytes) -> bool:
        data = self._data + index_key[len(self._index) + 8:]
        raw = self._db.get(data)
        self._db.delete(data)
        self._db.delete(index_key)
        self._count -= 1  # counted by index keys, as at construction
        # None: an index key whose entry was never written (killed in between)
        return raw is not None and raw[:1] == _WAITING

    def _walk(self) -> Iterator[tuple[int, bytes]]:
        """(arrival, index key) from the oldest not yet dropped."""
        prefix, n = self._index, len(self._index)
        it = self._db.iter()
        it.seek(prefix + max(self._floor, 0).to_bytes(8, "big"))
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            yield int.from_bytes(key[n:n + 8], "big"), key
            it.next()


def changelog_config(config: ControlConfig) -> dict[str, str]:
    """The changelog topic's settings: deleted after three of the longest attribution window
    of any scope, so entries leave the topic once no join could want them (two windows) and a
    restore never reads more than that; segments roll every window so retention can act. Not
    compacted: a record is a batch of entries (``PendingChangelog``), its key no request id."""
    windows = [config.labels.window_s, *(config.for_scope(s).labels.window_s
                                         for s in sorted(config.scopes))]
    window_ms = round(max(windows) * 1000)
    return {"cleanup.policy": "delete", "retention.ms": str(3 * window_ms),
            "segment.ms": str(window_ms)}


_encode_batch = msgspec.msgpack.Encoder().encode
_batch_decoder = msgspec.msgpack.Decoder(list[tuple[bytes, bytes]])


def decode_batch(value: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, entry) pairs of one changelog record; ``ValueError`` if it is not one."""
    try:
        return _batch_decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not a batch of pending entries: {exc}") from exc


class PendingChangelog:
    """The disk store's changelog: written as entries change, read back on assignment.

    One record a partition for each input message that changed entries (``flush``, called
    after each input message and each tick), holding them all as msgpack (key, entry) pairs,
    rather than one record an entry: a produce call costs a few us in librdkafka and a
    delivery report another, per record, and a client's batch of decisions or labels changes
    hundreds of entries. Produced with confluent-kafka (acks=all, idempotent), whose delivery
    reports tell the disk which offsets it holds.

    :param kafka: the cluster.
    :param topic: the changelog topic (partitioned as the inputs).
    :param path: the RocksDB directory (under the process's ``--data-dir``).
    :param settings: RocksDB's memory.
    """

    #: A record is flushed early past this (Kafka's default message.max.bytes is 1 MB).
    MAX_RECORD_BYTES = 256 * 1024

    def __init__(self, kafka: KafkaSettings, topic: str, path: Path,
                 settings: DiskSettings | None = None) -> None:
        self.kafka = kafka
        self.topic = topic
        self._producer: Producer | None = None
        self.disk = PendingDisk(path, self._emit, settings)
        self._queued: dict[int, list[tuple[bytes, bytes]]] = {}
        self._queued_bytes = 0
        #: Changelog records the broker refused (their entries are still on this disk).
        self.failed = 0

    @property
    def producer(self) -> Producer:
        """Made on first use: an app built but never run connects to nothing."""
        if self._producer is None:
            self._producer = kafka_clients.producer(self.kafka, **{"linger.ms": 20})
        return self._producer

    def _emit(self, partition: int, key: bytes, value: bytes) -> None:
        self._queued.setdefault(partition, []).append((key, value))
        self._queued_bytes += len(key) + len(value)
        if self._queued_bytes >= self.MAX_RECORD_BYTES:
            self.flush()

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        partition, offset = msg.partition(), msg.offset()
        if err is not None or partition is None or offset is None:
            self.failed += 1
            if self.failed == 1 or self.failed % 1_000 == 0:
                log.warning("pending changelog record not written (%d so far): %s",
                            self.failed, err)
            return
        self.disk.delivered(partition, offset)

    def flush(self) -> None:
        """Produce what the entries changed since the last call (one record a partition) and
        serve delivery reports; non-blocking unless librdkafka's queue is full."""
        if self._queued:
            queued, self._queued, self._queued_bytes = self._queued, {}, 0
            for partition, entries in queued.items():
                kafka_clients.produce_waiting(self.producer, self.topic,
                                              value=_encode_batch(entries),
                                              partition=partition, on_delivery=self._delivered)
        if self._producer is not None:
            self._producer.poll(0)

    def checkpoint(self) -> None:
        """Flush, and record the offsets delivered."""
        self.flush()
        if self._producer is not None:
            self.disk.checkpoint()

    def restore(self, partitions: list[int], timeout_s: float = 120.0) -> int:
        """Bring the disk up to the changelog's end for newly assigned `partitions`: from the
        offset after the last this disk holds, or from the beginning on a disk that has none
        of a partition. Blocking (run it in a thread); returns the entries read. A record
        that is not a batch is skipped with a warning."""
        starts = {}
        for p in partitions:
            held = self.disk.offset(p)
            starts[p] = None if held is None else held + 1
        read = 0

        def apply(partition: int, _key: bytes, value: bytes | None) -> None:
            nonlocal read
            try:
                entries = decode_batch(value or b"")
            except ValueError as exc:
                log.warning("pending changelog record of partition %d skipped: %s",
                            partition, exc)
                return
            for key, entry in entries:
                self.disk.apply(partition, key, entry)
            read += len(entries)

        last = replay_changelog(self.kafka, self.topic, starts, apply, timeout_s)
        for partition, offset in last.items():
            self.disk.restored(partition, offset)
        return read

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued and record its offsets (the database stays open: agents may
        still be finishing an event)."""
        self.flush()
        if self._producer is not None:
            self._producer.flush(timeout_s)
            self.disk.checkpoint()
