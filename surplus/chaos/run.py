"""The edge of `surplus chaos`: the fleet, the nemesis that injects a schedule, the recorder.

The fleet is the fault suite's (`surplus.fleet`): a control plane, two baseline workers and a
powerful (opportunistic) one, RMA and powerful capacity granted, ranking load through the
client library; here on a three-node KRaft cluster of its own (replication factor 3), every
process signing and checking with one key directory, and the client reaching each worker
through a toxiproxy proxy of its own. The nemesis injects each fault of the schedule
(`surplus.chaos.schedule`) on a thread of its own, so faults overlap as drawn; a fault whose
process is still healing from an earlier one (a broker still starting) is recorded as not
injected rather than piled on. The recorder keeps every request, every targets message
offered to the client, each worker's epoch (scraped every second), every notice, grant and
forged message, and at the end reads the preemption and dead-letter topics and the control
plane's join counts back; the history goes to ``history.jsonl`` and the checker
(`surplus.chaos.check`) judges it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import random
import secrets
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from schemas import kafka_clients
from schemas.clock import OFFSET_ENV, wall_ms
from schemas.codec import decode, encode
from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    DeadLetter,
    Event,
    LiftReport,
    OperatorOverride,
    PreemptionNotice,
)
from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from streams.control.config import RmaConfig
from surplus import localkafka
from surplus.chaos import history as h
from surplus.chaos.check import FORGED_EPOCH, Violation, check, counted_labels, summary
from surplus.chaos.config import ChaosConfig
from surplus.chaos.schedule import Fault, draw
from surplus.fleet.fleet import Fleet
from surplus.fleet.procs import POWERFUL_POOL, REGION, RMA_POOL, TopicReader, WorkerProc, metric
from surplus.fleet.toxiproxy import Toxiproxy
from surplus.topics import apply_topics
from workers.policy.targets import LocalLimits

BROKERS = 3
PARTITIONS = 2
KEY_ID = "chaos"
#: Seconds a broker, a control plane or a worker may take to come back before the run fails.
RESTART_TIMEOUT_S = 180.0
#: Age past its TTL a target may have when used (`RunInfo.ttl_slack_ms`).
TTL_SLACK_MS = 1000
#: Seconds the end waits for the control plane's join to count every label delivered.
LABELS_SETTLE_S = 60.0


class ChaosError(RuntimeError):
    """The run could not be set up or kept going (not an invariant violation)."""


@dataclass
class Options:
    seed: int
    duration_s: float
    out: Path
    config: ChaosConfig = field(default_factory=ChaosConfig)


@dataclass
class Result:
    summary: dict[str, Any]
    violations: list[Violation]
    history_path: Path


class Recorder:
    """What the nemesis did, as history records (appended from its threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[h.Record] = []

    def add(self, record: h.Record) -> None:
        with self.lock:
            self.records.append(record)

    def of(self, kind: type[h.Record]) -> list[h.Record]:
        with self.lock:
            return [r for r in self.records if isinstance(r, kind)]


def _digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


class Chaos:
    """One run: `run()` sets up, injects, records, checks, tears down."""

    def __init__(self, options: Options, say: Callable[[str], None] = print) -> None:
        self.o = options
        self.say = say
        self.out = options.out
        self.rec = Recorder()
        self.schedule = draw(options.seed, options.duration_s, options.config.schedule)
        self.keys = self._key_dir()
        self.keyring = Keyring({KEY_ID: (self.keys / KEY_ID).read_text().strip()}, KEY_ID)
        self.cluster_dir = self.out / "cluster"
        self.port = 0
        self.kafka: KafkaSettings | None = None
        self.toxi: Toxiproxy | None = None
        self.fleet: Fleet | None = None
        self.reader: TopicReader | None = None
        self.est_reader: TopicReader | None = None
        self.t0 = 0.0  # load time at which the schedule's clock starts
        self._stop = threading.Event()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._control_n = 1
        #: Processes are started on this one thread, alive the whole run: a child dies with
        #: the thread that started it (`surplus.live.procs`: PR_SET_PDEATHSIG is per thread),
        #: and each fault's thread ends when the fault heals.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="chaos-spawner")
        self._errors: list[str] = []
        self._sent_notices: list[bytes] = []

    # -- set-up ----------------------------------------------------------------------------------

    def _key_dir(self) -> Path:
        keys = self.out / "keys"
        keys.mkdir(parents=True, exist_ok=True)
        key = keys / KEY_ID
        if not key.exists():
            key.write_text(secrets.token_hex(32))
            key.chmod(0o600)
        return keys

    def _start(self) -> None:
        self.say(f"chaos: seed {self.o.seed}, {self.o.duration_s:.0f} s, "
                 f"{len(self.schedule)} faults drawn")
        localkafka.fetch_jars()
        self.port = localkafka.free_port_block(2 * BROKERS)
        info, _ = localkafka.up_cluster(BROKERS, port=self.port, data_dir=self.cluster_dir)
        self.kafka = KafkaSettings(bootstrap=info.bootstrap,
                                   prefix=f"chaos{self.o.seed}-{uuid.uuid4().hex[:4]}.")
        report = apply_topics(self.kafka.confluent(), self.kafka.prefix,
                              partitions_override=PARTITIONS)
        if not report.ok:
            raise ChaosError(f"topics not applied: {report}")
        self.say(f"chaos: {BROKERS}-node cluster at {info.bootstrap}")
        self.toxi = Toxiproxy(self.out / "logs").start()
        cfg = self.o.config
        self.fleet = Fleet(self.out / "fleet", self.kafka, baseline=2, powerful=1,
                           ttl_s=cfg.ttl_s, rate_rps=cfg.rate_rps, deadline_ms=cfg.deadline_ms,
                           signing_keys=self.keys, route=self._proxied,
                           load_options={"label_share": cfg.label_share})
        (self.out / "fleet").mkdir(parents=True, exist_ok=True)
        self.fleet.start()
        warm = self.fleet.warm_up(timeout_s=180)
        self.t0 = warm
        self.reader = TopicReader(self.kafka, "targets")
        # Followed from now on: the topic is compacted, so at the end it would hold only the
        # last few reports, and labels are counted from every one.
        self.est_reader = TopicReader(self.kafka, "estimates")
        self.say(f"chaos: fleet up, optional work flowing at {warm:.1f} s of load")

    def _proxied(self, worker: WorkerProc) -> str:
        assert self.toxi is not None
        port = localkafka.free_port()
        self.toxi.proxy(worker.name, port, worker.port)
        return f"http://127.0.0.1:{port}"

    # -- clocks ----------------------------------------------------------------------------------

    def now(self) -> float:
        """Load time (seconds), the history's time base."""
        assert self.fleet is not None
        return self.fleet.runner.now()

    def _sleep_until(self, t: float) -> bool:
        """Until load time ``t``; False when the run is stopping."""
        while not self._stop.is_set():
            left = t - self.now()
            if left <= 0:
                return True
            self._stop.wait(min(left, 0.5))
        return False

    # -- the nemesis -----------------------------------------------------------------------------

    def _lock(self, name: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(name, threading.Lock())

    def _inject(self, fault: Fault) -> None:
        """Run one fault from its start to its healing, holding what it occupies."""
        held: list[threading.Lock] = []
        for resource in sorted(fault.resources()):
            lock = self._lock(resource)
            if not lock.acquire(blocking=False):
                for other in held:
                    other.release()
                self._record(fault, self.now(), self.now(), ok=False,
                             detail=f"{resource} still healing from an earlier fault")
                return
            held.append(lock)
        started = self.now()
        try:
            detail = getattr(self, f"_do_{fault.kind}")(fault)
            self._record(fault, started, self.now(), ok=True, detail=detail or "")
        except Exception as exc:  # a fault that could not be injected is recorded, not fatal
            self._record(fault, started, self.now(), ok=False,
                         detail=f"{type(exc).__name__}: {exc}"[:500])
            self._errors.append(f"{fault.kind}:{fault.target}: {exc}")
        finally:
            for lock in held:
                lock.release()

    def _record(self, fault: Fault, t: float, end_t: float, *, ok: bool, detail: str) -> None:
        self.rec.add(h.FaultRecord(t=round(t, 3), end_t=round(end_t, 3), kind=fault.kind,
                                   target=fault.target, param=fault.param,
                                   baseline_path=fault.on_baseline_path, ok=ok, detail=detail))
        mark = "" if ok else " (not injected)"
        t, end_t = t - self.t0, end_t - self.t0
        self.say(f"  {t:7.1f}s {fault.kind:<13} {fault.target:<5} {fault.param:<22} "
                 f"healed {end_t:7.1f}s{mark} {detail[:80]}")

    def _hold(self, fault: Fault) -> None:
        self._stop.wait(fault.hold_s)

    def _node_pid(self, node: int) -> int:
        status = localkafka.cluster_status(self.cluster_dir)
        if status is None:
            raise ChaosError("the cluster is not running")
        return status.node(node).pid

    def _do_broker_kill(self, fault: Fault) -> str:
        os.killpg(self._node_pid(int(fault.target)), signal.SIGKILL)
        self._hold(fault)
        info, _ = self._spawner.submit(
            lambda: localkafka.up_cluster(BROKERS, port=self.port, data_dir=self.cluster_dir,
                                          timeout_s=RESTART_TIMEOUT_S)).result()
        return f"node {fault.target} back in {info.started_in_s or 0:.1f} s"

    def _do_broker_pause(self, fault: Fault) -> str:
        pid = self._node_pid(int(fault.target))
        os.killpg(pid, signal.SIGSTOP)
        try:
            self._hold(fault)
        finally:
            os.killpg(pid, signal.SIGCONT)
        return ""

    def _do_control_kill(self, fault: Fault) -> str:
        assert self.fleet is not None
        self.fleet.controls[-1].kill()
        self._hold(fault)
        self._control_n += 1
        name = f"cp{self._control_n}"
        fleet = self.fleet
        self._spawner.submit(lambda: fleet.control_plane(name)).result()
        return f"{name} started"

    def _restart(self, name: str, env: dict[str, str] | None = None) -> WorkerProc:
        assert self.fleet is not None and self.toxi is not None
        fleet = self.fleet
        worker = self._spawner.submit(
            lambda: fleet.restart_worker(name, env=env, timeout_s=RESTART_TIMEOUT_S)).result()
        self.toxi.set_upstream(name, worker.port)
        return worker

    def _do_worker_kill(self, fault: Fault) -> str:
        assert self.fleet is not None
        self.fleet.workers[fault.target].kill()
        self._hold(fault)
        self._restart(fault.target)
        return ""

    def _do_worker_freeze(self, fault: Fault) -> str:
        assert self.fleet is not None
        worker = self.fleet.workers[fault.target]
        worker.send(signal.SIGSTOP)
        try:
            self._hold(fault)
        finally:
            worker.send(signal.SIGCONT)
        return ""

    def _do_net_delay(self, fault: Fault) -> str:
        assert self.toxi is not None
        ms = int(fault.param)  # toxiproxy takes whole milliseconds only
        self.toxi.add_toxic(fault.target, "latency_down", "latency", "downstream",
                            latency=ms, jitter=ms // 4)
        try:
            self._hold(fault)
        finally:
            self.toxi.clear(fault.target)
        return ""

    def _do_net_cut(self, fault: Fault) -> str:
        assert self.toxi is not None
        self.toxi.set_enabled(fault.target, False)
        try:
            self._hold(fault)
        finally:
            self.toxi.clear(fault.target)
        return ""

    def _do_clock_jump(self, fault: Fault) -> str:
        self._restart(fault.target, env={OFFSET_ENV: fault.param})
        self._hold(fault)
        self._restart(fault.target, env={OFFSET_ENV: "0"})
        return "restarted with its clock off, then set right"

    # -- messages --------------------------------------------------------------------------------

    def _produce(self, topic: str, key: str, value: bytes) -> float | None:
        """Publish and wait for the broker's answer: load time of the ack, None if refused
        or not answered within 30 s."""
        assert self.kafka is not None
        producer = kafka_clients.producer(self.kafka, **{"linger.ms": 0})
        acked: list[float] = []

        def delivered(err: object, _msg: object) -> None:
            if err is None:
                acked.append(self.now())

        producer.produce(self.kafka.topic(topic), key=key.encode(), value=value,
                         on_delivery=delivered)
        producer.flush(30)
        return acked[0] if acked else None

    def _direct(self, notice: PreemptionNotice) -> float | None:
        """POST the signed notice straight to the powerful replica (as its scheduler or
        capacity agent does); load time of its answer, None when it gave none."""
        assert self.fleet is not None
        worker = self.fleet.workers["p1"]
        body = encode(notice)
        headers = {"Content-Type": "application/json",
                   **self.keyring.sign_request(body, wall_ms())}
        req = urllib.request.Request(f"{worker.url}/v1/preempt", data=body, headers=headers,
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2.0) as resp:
                resp.read()
                return self.now()
        except (urllib.error.URLError, OSError):
            return None

    def _notice(self, pool: str, replicas: list[str], deadline_s: float, n: int
                ) -> h.NoticeRecord:
        """A signed notice reclaiming the whole grant of ``pool`` (or ``replicas`` of it:
        the powerful pool's one replica is all of it), on Kafka and, for the powerful
        pool, straight to its replica."""
        now_ms = wall_ms()
        notice = self.keyring.sign(PreemptionNotice(
            notice_id=f"chaos-{self.o.seed}-{now_ms}-{n}", ts_ms=now_ms, region=REGION,
            pool_id=pool, replicas=replicas, deadline_ms=now_ms + int(deadline_s * 1000),
            accelerator="a100", accelerator_units=8.0 if pool == POWERFUL_POOL else 4.0))
        t = self.now()
        reclaims = pool == POWERFUL_POOL
        direct = self._direct(notice) if reclaims else None
        acked_t = self._produce("preemption", REGION, encode(notice))
        record = h.NoticeRecord(t=round(t, 3), notice_id=notice.notice_id, pool=pool,
                                replicas=replicas, deadline_t=round(t + deadline_s, 3),
                                acked=acked_t is not None, acked_t=acked_t,
                                reclaims_replica=reclaims, direct_t=direct)
        self.rec.add(record)
        self._sent_notices.append(encode(notice))
        return record

    def _grant(self, pool: str) -> None:
        assert self.fleet is not None
        t = self.now()
        acked = True
        try:
            self.fleet.grant(pool)
        except AssertionError:
            acked = False
        self.rec.add(h.GrantRecord(t=round(t, 3), pool=pool, acked=acked))

    def _rng(self, fault: Fault) -> random.Random:
        return random.Random(f"{self.o.seed}:{fault.at_s}:{fault.kind}")

    def _do_notice_storm(self, fault: Fault) -> str:
        rng = self._rng(fault)
        size = int(fault.param or "6")
        records = []
        for n in range(size):
            pool, replicas = rng.choice([(POWERFUL_POOL, []), (POWERFUL_POOL, ["p1"]),
                                         (RMA_POOL, [])])
            deadline_s = rng.choice((0.0, 0.5, 1.0, 2.0))
            records.append(self._notice(pool, replicas, deadline_s, n))
        self._hold(fault)
        self._grant(POWERFUL_POOL)
        self._grant(RMA_POOL)
        acked = sum(r.acked for r in records)
        direct = sum(r.direct_t is not None for r in records)
        return f"{len(records)} notices ({acked} acked, {direct} straight to p1), re-granted"

    def _genuine_targets(self) -> list[bytes]:
        assert self.reader is not None
        return [m.value() for m in list(self.reader.messages) if m.value()]

    def _do_duplicate(self, fault: Fault) -> str:
        targets = self._genuine_targets()[-3:]
        for value in targets:
            self._produce("targets", REGION, value)
        notices = self._sent_notices[-2:]
        for value in notices:
            notice = decode(PreemptionNotice, value)
            t = self.now()
            acked_t = self._produce("preemption", REGION, value)
            self.rec.add(h.NoticeRecord(t=round(t, 3), notice_id=notice.notice_id,
                                        pool=notice.pool_id, replicas=list(notice.replicas),
                                        deadline_t=round(t, 3), acked=acked_t is not None,
                                        acked_t=acked_t))
        return f"{len(targets)} targets, {len(notices)} notices again"

    def _do_reorder(self, fault: Fault) -> str:
        targets = self._genuine_targets()[-6:]
        for value in reversed(targets):
            self._produce("targets", REGION, value)
        return f"{len(targets)} targets, newest first"

    def _forge(self, topic: str, how: str, rng: random.Random) -> Event:
        now = wall_ms()
        event: Event
        if topic == "preemption":
            event = PreemptionNotice(notice_id=f"forged-{now}", ts_ms=now, region=REGION,
                                     pool_id=POWERFUL_POOL, deadline_ms=now,
                                     accelerator="a100", accelerator_units=8.0)
        elif topic == "capacity":
            event = CapacityEvent(event_id=f"forged-{now}", ts_ms=now, region=REGION,
                                  pool_id=RMA_POOL, kind="grant", accelerator="a100",
                                  accelerator_units=64.0, cpu_units=512.0,
                                  expires_at_ms=now + 600_000)
        elif topic == "overrides":
            event = OperatorOverride(scope=REGION, issued_at_ms=now, ttl_ms=600_000,
                                     reason="forged by the nemesis", kill=True)
        else:
            genuine = self._genuine_targets()
            if not genuine:
                raise ChaosError("no genuine targets to forge from yet")
            model = decode(ControlTargets, genuine[-1])
            event = ControlTargets(scope=REGION, epoch=FORGED_EPOCH + rng.randrange(10**6),
                                   issued_at_ms=now, ttl_ms=model.ttl_ms, rma=model.rma,
                                   sbm=model.sbm)
        if how == "unknown_key":
            return Keyring({"forger": secrets.token_hex(32)}, "forger").sign(event)
        if how == "bad_signature":
            return Keyring({KEY_ID: secrets.token_hex(32)}, KEY_ID).sign(event)
        return event

    def _do_forge(self, fault: Fault) -> str:
        topic, how = fault.param.split(":", 1)
        event = self._forge(topic, how, self._rng(fault))
        value = encode(event)
        t = self.now()
        acked_t = self._produce(topic, REGION, value)
        self.rec.add(h.ForgedRecord(t=round(t, 3), topic=topic, how=how, digest=_digest(value),
                                    acked=acked_t is not None))
        return f"{type(event).__name__} {how}"

    # -- watching --------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Each worker's epoch every second, and the targets topic followed (for duplicates
        and forgeries), until the run stops."""
        assert self.fleet is not None and self.reader is not None
        next_scrape = 0.0
        while not self._stop.is_set():
            self.reader.poll(0.1)
            if self.est_reader is not None:
                self.est_reader.poll(0.1)
            if time.monotonic() < next_scrape:
                continue
            next_scrape = time.monotonic() + 1.0
            for name, worker in list(self.fleet.workers.items()):
                with contextlib.suppress(OSError, ValueError):
                    epoch = metric(worker.metrics(), "surplus_worker_targets_epoch")
                    self.rec.add(h.WorkerEpoch(t=round(self.now(), 3), worker=name,
                                               epoch=int(epoch)))

    # -- the end ---------------------------------------------------------------------------------

    def _read_all(self, topic: str, seconds: float = 5.0) -> list[bytes]:
        assert self.kafka is not None
        reader = TopicReader(self.kafka, topic)
        try:
            reader.poll(seconds)
            return [m.value() for m in reader.messages if m.value()]
        finally:
            reader.close()

    def _read_back(self) -> None:
        ids = []
        for value in self._read_all("preemption"):
            with contextlib.suppress(Exception):
                ids.append(decode(PreemptionNotice, value).notice_id)
        self.rec.add(h.ReadBack(topic="preemption", ids=ids))
        for value in self._read_all("deadletter"):
            with contextlib.suppress(Exception):
                letter = decode(DeadLetter, value)
                self.rec.add(h.DeadLetterRecord(
                    source_topic=letter.source_topic, reason=letter.reason,
                    digest=_digest(base64.b64decode(letter.value_b64))))

    def _labels(self, delivered: int, sent: int) -> None:
        """Every LiftReport of the scope (followed through the run), read on until the join
        has counted every label delivered (or ``LABELS_SETTLE_S`` passed)."""
        assert self.est_reader is not None
        estimates: list[h.Estimate] = []
        deadline = time.monotonic() + LABELS_SETTLE_S
        while time.monotonic() < deadline:
            self.est_reader.poll(2.0)
            estimates = []
            for message in self.est_reader.messages:
                with contextlib.suppress(Exception):
                    report = decode(LiftReport, message.value())
                    if report.scope == REGION:
                        t = self.now() - (wall_ms() - report.ts_ms) / 1000.0
                        estimates.append(h.Estimate(t=round(t, 3), ts_ms=report.ts_ms,
                                                    epoch=report.epoch,
                                                    join=dict(report.join)))
            probe = h.History([h.RunInfo(seed=0, duration_s=1, sla_p99_ms=1, window_s=1,
                                         ttl_ms=1, max_clock_skew_ms=0, ttl_slack_ms=0,
                                         settle_s=0), *self.rec.of(h.FaultRecord),
                               *estimates])
            if sum(counted_labels(probe).values()) >= delivered:
                break
        for estimate in estimates:
            self.rec.add(estimate)
        assert self.fleet is not None
        load = self.fleet.runner
        ends = {s.request_id: s.end_t for s in load.samples}
        times = sorted(round(ends[i], 3) for i in load.labelled if i in ends)
        self.rec.add(h.LabelTotals(sent=sent, delivered=delivered, times=times))

    def _history(self) -> list[h.Record]:
        assert self.fleet is not None
        load = self.fleet.runner
        cfg = self.o.config
        sla = cfg.sla_p99_ms if cfg.sla_p99_ms is not None else RmaConfig().sla_p99_ms
        run = h.RunInfo(seed=self.o.seed, duration_s=self.o.duration_s, sla_p99_ms=sla,
                        window_s=cfg.window_s, ttl_ms=int(cfg.ttl_s * 1000),
                        max_clock_skew_ms=LocalLimits().max_clock_skew_ms,
                        ttl_slack_ms=TTL_SLACK_MS,
                        settle_s=cfg.settle_s)
        shift = self.t0
        out: list[h.Record] = [run]
        for s in load.samples:
            if s.t < shift:
                continue
            out.append(h.Request(
                t=round(s.t - shift, 4), end_t=round(s.end_t - shift, 4),
                request_id=s.request_id, served=s.served, latency_ms=round(s.latency_ms, 2),
                error=s.error, model=s.model, routed=s.routed, fell_back=s.fell_back,
                extra=s.extra_sent, optional_scored=s.optional_scored, wall_ms=s.wall_ms,
                epoch=s.epoch, issued_at_ms=s.issued_at_ms, ttl_ms=s.ttl_ms,
                baseline_only=s.baseline_only))
        out += [h.TargetOffer(t=round(o.t - shift, 4), wall_ms=o.wall_ms, epoch=o.epoch,
                              issued_at_ms=o.issued_at_ms, ttl_ms=o.ttl_ms,
                              accepted=o.accepted, reason=o.reason) for o in load.offers]

        def shifted(record: h.Record) -> h.Record:
            changes = {name: round(getattr(record, name) - shift, 3)
                       for name in ("t", "end_t", "deadline_t", "acked_t", "direct_t")
                       if getattr(record, name, None) is not None}
            if isinstance(record, h.LabelTotals):
                changes["times"] = [round(x - shift, 3) for x in record.times]
            return msgspec.structs.replace(record, **changes)

        with self.rec.lock:
            out += [shifted(r) if hasattr(r, "t") or isinstance(r, h.LabelTotals) else r
                    for r in self.rec.records]
        return out

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> Result:
        self.out.mkdir(parents=True, exist_ok=True)
        with _stderr_to(self.out / "logs" / "clients.log"):
            return self._run()

    def _run(self) -> Result:
        watcher: threading.Thread | None = None
        threads: list[threading.Thread] = []
        try:
            self._start()
            assert self.fleet is not None
            watcher = threading.Thread(target=self._watch, name="chaos-watch", daemon=True)
            watcher.start()
            for fault in self.schedule:
                if not self._sleep_until(self.t0 + fault.at_s):
                    break
                thread = threading.Thread(target=self._inject, args=(fault,),
                                          name=f"nemesis-{fault.kind}", daemon=True)
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join(RESTART_TIMEOUT_S + 60)
            self._sleep_until(self.t0 + self.o.duration_s)
            crashed = self._crashed()
            load = self.fleet.runner
            load.stop()
            summary_client = load.client_summary()
            labels = summary_client.get("decisions", {}).get("labels", {})
            if not isinstance(labels, dict):
                labels = {}
            sent = int(labels.get("sent", len(load.labelled)))
            dropped = int(labels.get("dropped_queue_full", 0))
            self._stop.set()
            if watcher is not None:
                watcher.join(10)
            self._read_back()
            self._labels(delivered=sent - dropped, sent=sent)
            records = self._history()
        finally:
            self._stop.set()
            self._teardown()
        path = self.out / "history.jsonl"
        with path.open("wb") as f:
            for record in records:
                f.write(h.encode(record) + b"\n")
        history = h.History(records)
        violations = check(history)
        result = summary(history, violations)
        result["errors"] = self._errors
        result["crashed"] = crashed
        result["schedule"] = [msgspec.to_builtins(f) for f in self.schedule]
        (self.out / "summary.json").write_text(json.dumps(result, indent=2, default=str))
        return Result(result, violations, path)

    def _crashed(self) -> list[str]:
        """Processes of the fleet that are not running once every fault has healed (the
        current control plane and every worker): a crash the faults did not mean."""
        assert self.fleet is not None
        procs = [self.fleet.controls[-1], *self.fleet.workers.values()]
        return [f"{p.log_path.name}: {p.tail(3)}" for p in procs if not p.alive()]

    def _teardown(self) -> None:
        for reader in (self.reader, self.est_reader):
            if reader is not None:
                with contextlib.suppress(Exception):
                    reader.close()
        if self.fleet is not None:
            with contextlib.suppress(Exception):
                self.fleet.stop()
        if self.toxi is not None:
            self.toxi.stop()
        self._spawner.shutdown(wait=False)
        status = localkafka.cluster_status(self.cluster_dir)
        if status is not None:
            for node in status.nodes:  # a paused node cannot stop
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(node.pid, signal.SIGCONT)
        localkafka.down_cluster(self.cluster_dir)


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """This process's stderr (file descriptor 2) into ``path`` for the run: the Kafka
    clients it runs (librdkafka) log every broker the nemesis kills there, not on the
    terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = os.dup(2)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def report(result: Result, say: Callable[[str], None]) -> None:
    """The faults injected by kind and the violations, each with its window to replay."""
    s = result.summary
    say(f"seed {s['seed']}, {s['duration_s']} s: {s['requests']} requests, {s['served']} "
        f"served, {s['served_powerful']} by the powerful model, {s['optional_scored']} extra "
        f"candidates scored")
    say(f"faults injected: {s['faults']}")
    if s["faults_not_injected"]:
        say(f"faults not injected: {s['faults_not_injected']}")
    say(f"violations: {s['violations']}")
    for v in result.violations:
        say(f"  {v.invariant} in [{v.t0:.1f}, {v.t1:.1f}] s: {v.what}")
        if v.faults:
            say(f"    faults then: {', '.join(v.faults)}")
    if result.violations:
        say(f"replay: surplus chaos --seed {s['seed']} --duration {s['duration_s']:g} "
            f"(history {result.history_path})")
