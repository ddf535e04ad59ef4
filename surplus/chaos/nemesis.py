"""The nemesis of `surplus chaos`: each fault of the schedule, from its start to its healing.

`Nemesis.inject` runs one fault (`surplus.chaos.schedule.Fault`) on the caller's thread,
holding what it occupies (a broker, a worker, the control plane): a fault whose process is
still healing from an earlier one is recorded as not injected rather than piled on. Every
fault, notice, grant and forged message goes to the `Recorder` as a history record
(`surplus.chaos.history`). The fleet, the proxies in front of its workers, the recorder and
the keyring come in explicitly; `surplus.chaos.run` sets them up and sequences the schedule.
"""

from __future__ import annotations

import hashlib
import os
import random
import secrets
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from schemas import kafka_clients
from schemas.clock import OFFSET_ENV, wall_ms
from schemas.codec import decode, encode
from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    Event,
    OperatorOverride,
    PreemptionNotice,
)
from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from surplus import localkafka
from surplus.chaos import history as h
from surplus.chaos.check import FORGED_EPOCH
from surplus.chaos.schedule import Fault
from surplus.fleet.fleet import Fleet
from surplus.fleet.procs import POWERFUL_POOL, REGION, RMA_POOL, TopicReader, WorkerProc
from surplus.fleet.toxiproxy import Toxiproxy

#: Seconds a broker, a control plane or a worker may take to come back before the run fails.
RESTART_TIMEOUT_S = 180.0


class ChaosError(RuntimeError):
    """The run could not be set up or kept going (not an invariant violation)."""


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


def digest(value: bytes) -> str:
    """How a forged message is known again on the dead-letter topic."""
    return hashlib.sha256(value).hexdigest()


class Nemesis:
    """Injects faults into a running fleet and records what it did. `inject` may run on
    several threads at once (faults overlap); processes it restarts are started on one
    spawner thread of its own, alive until `close`."""

    def __init__(self, fleet: Fleet, proxies: Toxiproxy, recorder: Recorder,
                 keyring: Keyring, *, kafka: KafkaSettings, cluster_dir: Path,
                 cluster_port: int, brokers: int, targets: TopicReader, seed: int, t0: float,
                 stop: threading.Event, say: Callable[[str], None] = print) -> None:
        """
        :param fleet: the running fleet (its control planes and workers, its load's clock).
        :param proxies: the toxiproxy in front of each worker, proxies named by worker.
        :param recorder: where every fault, notice, grant and forgery is recorded.
        :param keyring: the fleet's keyring: genuine notices are signed with it, and a
            forgery with a bad signature claims its signing key id.
        :param kafka: the cluster's settings, to publish notices, targets and forgeries.
        :param cluster_dir: the cluster's data directory (`surplus.localkafka`).
        :param cluster_port: the first port of the cluster's block, to bring a node back.
        :param brokers: the cluster's node count.
        :param targets: a reader following the targets topic: the genuine targets to
            duplicate, reorder and forge from.
        :param seed: the run's seed (notice ids, each fault's own random draws).
        :param t0: load time at which the schedule's clock starts (for what is printed).
        :param stop: set when the run stops: a fault's hold ends early.
        :param say: where each healed fault is printed.
        """
        self.fleet = fleet
        self.toxi = proxies
        self.rec = recorder
        self.keyring = keyring
        self.kafka = kafka
        self.cluster_dir = cluster_dir
        self.port = cluster_port
        self.brokers = brokers
        self.reader = targets
        self.seed = seed
        self.t0 = t0
        self.say = say
        self._stop = stop
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._control_n = len(fleet.controls)
        #: Processes are started on this one thread, alive the whole run: a child dies with
        #: the thread that started it (`surplus.live.procs`: PR_SET_PDEATHSIG is per thread),
        #: and each fault's thread ends when the fault heals.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="chaos-spawner")
        #: Faults that could not be injected, with why.
        self.errors: list[str] = []
        self._sent_notices: list[bytes] = []

    def now(self) -> float:
        """Load time (seconds), the history's time base."""
        return self.fleet.runner.now()

    def close(self) -> None:
        """Let the spawner thread go (the processes it started are the fleet's to stop)."""
        self._spawner.shutdown(wait=False)

    # -- faults ------------------------------------------------------------------------------------

    def _lock(self, name: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(name, threading.Lock())

    def inject(self, fault: Fault) -> None:
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
            self.errors.append(f"{fault.kind}:{fault.target}: {exc}")
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
            lambda: localkafka.up_cluster(self.brokers, port=self.port, data_dir=self.cluster_dir,
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
        self.fleet.controls[-1].kill()
        self._hold(fault)
        self._control_n += 1
        name = f"cp{self._control_n}"
        fleet = self.fleet
        self._spawner.submit(lambda: fleet.control_plane(name)).result()
        return f"{name} started"

    def _restart(self, name: str, env: dict[str, str] | None = None) -> WorkerProc:
        fleet = self.fleet
        worker = self._spawner.submit(
            lambda: fleet.restart_worker(name, env=env, timeout_s=RESTART_TIMEOUT_S)).result()
        self.toxi.set_upstream(name, worker.port)
        return worker

    def _do_worker_kill(self, fault: Fault) -> str:
        self.fleet.workers[fault.target].kill()
        self._hold(fault)
        self._restart(fault.target)
        return ""

    def _do_worker_freeze(self, fault: Fault) -> str:
        worker = self.fleet.workers[fault.target]
        worker.send(signal.SIGSTOP)
        try:
            self._hold(fault)
        finally:
            worker.send(signal.SIGCONT)
        return ""

    def _do_net_delay(self, fault: Fault) -> str:
        ms = int(fault.param)  # toxiproxy takes whole milliseconds only
        self.toxi.add_toxic(fault.target, "latency_down", "latency", "downstream",
                            latency=ms, jitter=ms // 4)
        try:
            self._hold(fault)
        finally:
            self.toxi.clear(fault.target)
        return ""

    def _do_net_cut(self, fault: Fault) -> str:
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
            notice_id=f"chaos-{self.seed}-{now_ms}-{n}", ts_ms=now_ms, region=REGION,
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
        t = self.now()
        acked = True
        try:
            self.fleet.grant(pool)
        except AssertionError:
            acked = False
        self.rec.add(h.GrantRecord(t=round(t, 3), pool=pool, acked=acked))

    def _rng(self, fault: Fault) -> random.Random:
        return random.Random(f"{self.seed}:{fault.at_s}:{fault.kind}")

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
            signer = self.keyring.signing_id
            return Keyring({signer: secrets.token_hex(32)}, signer).sign(event)
        return event

    def _do_forge(self, fault: Fault) -> str:
        topic, how = fault.param.split(":", 1)
        event = self._forge(topic, how, self._rng(fault))
        value = encode(event)
        t = self.now()
        acked_t = self._produce(topic, REGION, value)
        self.rec.add(h.ForgedRecord(t=round(t, 3), topic=topic, how=how, digest=digest(value),
                                    acked=acked_t is not None))
        return f"{type(event).__name__} {how}"
