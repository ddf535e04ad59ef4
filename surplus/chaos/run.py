"""The edge of `surplus chaos`: the fleet set up, the schedule sequenced, the history recorded.

The fleet is the fault suite's (`surplus.fleet`): a control plane, two baseline workers and a
powerful (opportunistic) one, RMA and powerful capacity granted, ranking load through the
client library; here on a three-node KRaft cluster of its own (replication factor 3), every
process signing and checking with one key directory, and the client reaching each worker
through a toxiproxy proxy of its own. The nemesis (`surplus.chaos.nemesis`) injects each
fault of the schedule (`surplus.chaos.schedule`) on a thread of its own, started here at the
fault's time, so faults overlap as drawn; a fault whose process is still healing from an
earlier one (a broker still starting) is recorded as not injected rather than piled on. The
recorder keeps every request, every targets message
offered to the client, each worker's epoch (scraped every second), every notice, grant and
forged message, and at the end reads the preemption and dead-letter topics and the control
plane's join counts back (`surplus.chaos.readback`); the history, on the schedule's clock
(`surplus.chaos.assembly`), goes to ``history.jsonl`` and the checker (`surplus.chaos.check`)
judges it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from surplus import localkafka
from surplus.chaos import assembly, readback
from surplus.chaos import history as h
from surplus.chaos.assembly import TTL_SLACK_MS
from surplus.chaos.check import Violation, check, summary
from surplus.chaos.config import ChaosConfig
from surplus.chaos.nemesis import RESTART_TIMEOUT_S, ChaosError, Nemesis, Recorder
from surplus.chaos.readback import LABELS_SETTLE_S
from surplus.chaos.schedule import draw
from surplus.fleet.fleet import Fleet
from surplus.fleet.procs import TopicReader, WorkerProc, metric
from surplus.fleet.toxiproxy import Toxiproxy
from surplus.topics import apply_topics

BROKERS = 3
PARTITIONS = 2
KEY_ID = "chaos"

# The names other modules import from here (`surplus chaos`, the fault suite).
__all__ = ["BROKERS", "KEY_ID", "LABELS_SETTLE_S", "PARTITIONS", "TTL_SLACK_MS", "Chaos",
           "ChaosError", "Options", "Result", "report"]


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
        self.nemesis: Nemesis | None = None

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
        self.nemesis = Nemesis(self.fleet, self.toxi, self.rec, self.keyring, kafka=self.kafka,
                               cluster_dir=self.cluster_dir, cluster_port=self.port,
                               brokers=BROKERS, targets=self.reader, seed=self.o.seed,
                               t0=self.t0, stop=self._stop, say=self.say)
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

    def _labels(self, delivered: int, sent: int) -> None:
        assert self.est_reader is not None and self.fleet is not None
        readback.labels(self.est_reader, self.rec, self.fleet.runner, self.now,
                        delivered=delivered, sent=sent)

    def _history(self) -> list[h.Record]:
        assert self.fleet is not None
        load = self.fleet.runner
        run = assembly.run_info(self.o.seed, self.o.duration_s, self.o.config)
        return assembly.history(run, load.samples, load.offers, self.rec, self.t0)

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
            assert self.fleet is not None and self.nemesis is not None
            watcher = threading.Thread(target=self._watch, name="chaos-watch", daemon=True)
            watcher.start()
            for fault in self.schedule:
                if not self._sleep_until(self.t0 + fault.at_s):
                    break
                thread = threading.Thread(target=self.nemesis.inject, args=(fault,),
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
            assert self.kafka is not None
            readback.read_back(self.kafka, self.rec)
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
        result["errors"] = [] if self.nemesis is None else self.nemesis.errors
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
        if self.nemesis is not None:
            self.nemesis.close()
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
    start = s["startup"]
    say(f"start-up ({start['seconds']:g} s, not judged for the SLA): baseline p99 "
        f"{start['baseline_p99_ms']} ms")
    say(f"violations: {s['violations']}")
    for v in result.violations:
        say(f"  {v.invariant} in [{v.t0:.1f}, {v.t1:.1f}] s: {v.what}")
        if v.faults:
            say(f"    faults then: {', '.join(v.faults)}")
    if result.violations:
        say(f"replay: surplus chaos --seed {s['seed']} --duration {s['duration_s']:g} "
            f"(history {result.history_path})")
