"""`surplus demo`: the whole system on one machine, as real processes, then a report.

Order of a run (each step waits for the one before, and every wait gives up on Ctrl-C):

1. Kafka: the given cluster, or an embedded KRaft broker in a temporary directory; topics.
2. The event-log recorder (``surplus record``), so the log holds the run from its first event.
3. The control plane (Faust worker) and the provisioned inference workers, each in its own
   session, then readiness (``/readyz``; a worker warms its model up before it is ready).
4. The capacity scheduler and the load generator on one shared timeline; opportunistic
   replicas start when their capacity is lent and are stopped at the deadline of the notice
   that takes it back (``plan.replica_changes``), so clients really lose them.
5. Live progress until the duration is over.
6. Shutdown in dependency order — load first, then the scheduler (which revokes what it lent),
   workers (after their preemption histograms are scraped; a reclaimed replica's are scraped
   before it stops), control plane, recorder, Prometheus, broker — and a report built only
   from what the run left on disk.

The opportunistic replicas' lives and CPU slices are kept by ``replicas.ReplicaBook``; the
options and ports by ``options``; Kafka and its topics by ``broker``; the files a run writes
for its processes and its report (worker config, ``run.json``, the verdict line, the scrape
config) by ``runinfo``.

A Ctrl-C or SIGTERM at any point jumps to step 6 with what exists; a second one shortens the
waits. Every child runs in its own session with a parent-death signal, so none outlives the run.
"""


from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from schemas.clock import wall_ms
from schemas.kafka_config import KafkaSettings
from schemas.topics import SCOPE_PARTITIONS
from sim import schedule
from sim.scenario import ScenarioError
from surplus import localkafka
from surplus.demo import broker, report, runinfo
from surplus.demo.children import Children, ready
from surplus.demo.monitor import Monitor, progress_line
from surplus.demo.options import (
    APP_ID,
    DEFAULT_PREFIX,
    LEAD_S,
    DemoError,
    DemoOptions,
    Interrupted,
    Ports,
    signing_dir,
)
from surplus.demo.replicas import ReplicaBook, niceness_shortfalls
from surplus.demo.runinfo import prometheus_config, run_info, verdict
from surplus.live import plan
from surplus.live.procs import Child, metrics_text, wait_until

# The names other modules import from here (``surplus demo``, ``surplus soak``, the tests).
__all__ = ["APP_ID", "DEFAULT_PREFIX", "LEAD_S", "Demo", "DemoError", "DemoOptions",
           "Interrupted", "Ports", "prometheus_config", "run_info", "verdict"]


class Demo:
    """One run; ``run()`` returns the process exit status (0 done, 1 failed, 130 interrupted)."""

    def __init__(self, options: DemoOptions, say: Callable[[str], None] = print) -> None:
        self.opt = options
        self.say = say
        self.out = options.out
        self.stop = threading.Event()
        self.hurry = threading.Event()
        #: The run's processes by name.
        self.children = Children(self.out / "logs", say, lambda: self.book.offline,
                                 options.background_nice)
        self.broker_dir: Path | None = None
        self.state = Path(tempfile.mkdtemp(prefix="surplus-demo-"))
        self.monitor: Monitor | None = None
        self.kafka: KafkaSettings | None = None
        self.start_ms = 0
        self.end_ms = 0
        self.error: str | None = None
        self.prometheus_port = 0
        #: The opportunistic replicas' lives and CPU slices.
        self.book = ReplicaBook(
            options, self.out, self.children, say,
            ready=lambda worker_id, t: ready(self.ports.workers[worker_id], t),
            scrape=self._scrape)

    # -- the run -------------------------------------------------------------------------

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._run()
        except Interrupted:
            self.say("interrupted: stopping everything and writing what the run has")
        except (DemoError, ScenarioError, localkafka.BrokerError, OSError) as exc:
            self.error = str(exc)
            self.say(f"error: {exc}")
        finally:
            self._shutdown()
            self._write_report()
            shutil.rmtree(self.state, ignore_errors=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.error:
            return 1
        return 130 if self.stop.is_set() else 0

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stop.is_set():
            self.hurry.set()
        self.stop.set()

    def _check(self) -> None:
        if self.stop.is_set():
            raise Interrupted

    def _run(self) -> None:
        self._prepare()
        self._connect()
        self._check()
        self._start_recorder()
        self._start_control_plane()
        self._start_workers()
        self._wait_ready("control-plane", self.ports.control, 120.0)
        self._start_load()
        self._watch()

    def _prepare(self) -> None:
        self.scenario, self.base_dir = plan.load(self.opt.scenario, self.opt.duration_s)
        self.region = self.scenario.regions[0]
        self.actions = schedule.build(self.scenario, self.base_dir)
        self.phases = plan.phases(self.scenario, schedule.first_grant_s(self.actions))
        self.replicas = plan.replicas(self.region)
        self.changes = plan.replica_changes(self.actions, self.replicas)
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "report.html", "run.json", report.EVENT_LOG, report.SLICES,
                     "worker_metrics.json", "latency.png", "targets.png", "capacity.png",
                     "shedding.png"):
            (self.out / name).unlink(missing_ok=True)
        shutil.rmtree(self.out / "loadgen", ignore_errors=True)
        shutil.rmtree(self.out / "logs", ignore_errors=True)
        (self.out / "control.toml").write_text(plan.control_toml(self.scenario))
        self.keys = signing_dir(self.out)
        control, scheduler, loadgen, *workers = localkafka.free_ports(3 + len(self.replicas))
        self.ports = Ports(control=control, scheduler=scheduler, loadgen=loadgen,
                           workers={r.worker_id: port
                                    for r, port in zip(self.replicas, workers, strict=True)})
        self.say(f"demo: scenario {self.scenario.name}, {self.opt.duration_s:.0f}s of load, "
                 f"{len(self.replicas)} workers "
                 f"({', '.join(r.worker_id for r in self.replicas)}); output in {self.out}")

    # -- Kafka -----------------------------------------------------------------------------

    def _connect(self) -> None:
        bootstrap = (self.opt.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
                     or os.environ.get("SURPLUS_KAFKA_BOOTSTRAP"))
        if bootstrap:
            self.say(f"kafka: using {bootstrap}")
        else:
            self.broker_dir = self.state / "kafka"
            bootstrap = broker.embedded(self.broker_dir, self.say)
        self.kafka = broker.with_topics(bootstrap, self.opt.prefix or DEFAULT_PREFIX, self.say,
                                        self.stop)

    def _kafka_args(self) -> list[str]:
        assert self.kafka is not None
        return ["--bootstrap", self.kafka.bootstrap, "--prefix", self.kafka.prefix]

    def _signing_args(self) -> list[str]:
        return ["--signing-key-file", str(self.keys)]

    # -- processes -------------------------------------------------------------------------

    def _start_recorder(self) -> None:
        since = wall_ms() - 1000
        self.children.launch("recorder", ["record", "--out", str(self.out / report.EVENT_LOG),
                                 "--from", f"time:{since}", "--quiet", *self._kafka_args()])

    def _start_control_plane(self) -> None:
        assert self.kafka is not None
        self.children.launch("control-plane", [
            "control-plane", *self._kafka_args(), "--config", str(self.out / "control.toml"),
            "--app-id", APP_ID, "--partitions", str(SCOPE_PARTITIONS),
            "--metrics-port", str(self.ports.control), "--data-dir", str(self.state / "control"),
            "--loglevel", "warning", *self._signing_args()])
        self.monitor = Monitor(self.kafka, self.scenario.control.period_ms)
        self.monitor.start()

    def _worker_config(self) -> Path:
        path = self.out / "worker.toml"
        path.write_text(plan.to_toml(runinfo.worker_tree(self.scenario, self.replicas)))
        return path

    def _start_workers(self) -> None:
        """Every worker gets its process description now; the provisioned ones start now, the
        opportunistic ones whose capacity follows a schedule when it lends them (each in its
        CPU slice where the host allows, see ``ReplicaBook.open_slices``)."""
        config = self._worker_config()
        managed = plan.managed_replicas(self.changes)
        made = self.book.open_slices(self.replicas)
        for r in self.replicas:
            cpu = made.get(r.worker_id)
            self.children[r.worker_id] = Child(r.worker_id, [
                "worker", "--config", str(config), "--worker-id", r.worker_id,
                "--region", r.region, "--service", r.service, "--tier", r.tier,
                "--accelerator", r.accelerator, "--model", r.model,
                "--port", str(self.ports.workers[r.worker_id]), *self._kafka_args(),
                "--loglevel", "warning", *self._signing_args()], self.out / "logs",
                nice=(self.opt.opportunistic_nice if r.tier == "opportunistic"
                      else self.opt.provisioned_nice),
                enter=cpu.enter if cpu is not None else None)
        now = [r.worker_id for r in self.replicas if r.worker_id not in managed]
        self.book.offline = set(managed)
        for worker_id in now:
            self.children[worker_id].start()
            if worker_id in made:
                self.book.lives[worker_id] = 1
        self.say(f"workers: starting {', '.join(now)} (torch models load and warm up in each); "
                 f"{len(managed)} opportunistic replica(s) start when their capacity is lent")
        for worker_id in now:
            self._wait_ready(worker_id, self.ports.workers[worker_id], 180.0)
        self.children.check_alive()
        for note in niceness_shortfalls(self.children, self.replicas, now,
                                        self.opt.provisioned_nice):
            self.say(note)
        self.say("workers: ready")

    def _wait_ready(self, name: str, port: int, timeout_s: float) -> None:
        """Wait for a child's ``/readyz`` (a worker: model warm, Kafka read; the control plane:
        partitions assigned, state read back, ticking); fail with its log's tail."""
        ok = wait_until(partial(ready, port), timeout_s, 0.5, stop=self._stopping)
        self._check()
        self.children.check_alive()
        if not ok:
            raise DemoError(f"{name} not ready within {timeout_s:.0f}s:\n"
                            f"{self.children[name].tail()}")
        if name == "control-plane":
            self.say("control plane: ready")

    def _stopping(self) -> bool:
        return self.stop.is_set() or bool(self.children.dead())

    def _start_load(self) -> None:
        self.start_ms = wall_ms() + int(LEAD_S * 1000)
        self.end_ms = self.start_ms + int(self.opt.duration_s * 1000)
        timeline = ["--scenario", str(plan.scenario_path(self.opt.scenario)),
                    "--duration", str(self.opt.duration_s), "--start-at-ms", str(self.start_ms)]
        self.children.launch("scheduler", ["scheduler", *timeline, "--metrics-port",
                                  str(self.ports.scheduler), *self._kafka_args(),
                                  *self._signing_args()])
        # The load generator's client routes from the replicas topic: a reclaimed replica says
        # it is draining when its notice arrives, before it goes; one starting is not there
        # until it serves.
        rate = ["--rate", str(self.opt.rate)] if self.opt.rate else []
        self.children.launch("loadgen", ["loadgen", *timeline, "--membership", *rate, "--out",
                                str(self.out / "loadgen"), "--metrics-port",
                                str(self.ports.loadgen), *self._kafka_args(),
                                *self._signing_args()])
        self.book.start_ms = self.start_ms
        self.book.pending = list(self.changes)
        if self.opt.prometheus:
            self._start_prometheus()
        self.say(f"load: starts in {LEAD_S:.0f}s and runs {self.opt.duration_s:.0f}s; "
                 "phases: " + ", ".join(f"{p.name} {p.start_s:.0f}-{p.end_s:.0f}s"
                                        for p in self.phases))

    def _start_prometheus(self) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            self.say("prometheus: no `prometheus` binary on PATH (Debian/Ubuntu: apt install "
                     "prometheus); going on without it")
            return
        targets = {"control-plane": [self.ports.control], "scheduler": [self.ports.scheduler],
                   "loadgen": [self.ports.loadgen],
                   "workers": sorted(self.ports.workers.values())}
        pools = {self.ports.workers[r.worker_id]: r.pool_id for r in self.replicas}
        config = self.out / "prometheus.yml"
        config.write_text(prometheus_config(targets, pools))
        port = self.prometheus_port = localkafka.free_port()
        self.children.launch("prometheus", [f"--config.file={config}",
                                   f"--storage.tsdb.path={self.state / 'prometheus'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], program=[binary])
        self.say(f"prometheus: http://127.0.0.1:{port} (scraping {sum(map(len, targets.values()))}"
                 " endpoints every 2s)")

    # -- while it runs ---------------------------------------------------------------------

    def _watch(self) -> None:
        next_line = 0.0
        while wall_ms() < self.end_ms:
            self._check()
            self.book.follow()
            self.children.check_alive()
            if time.monotonic() >= next_line:
                self._progress()
                next_line = time.monotonic() + self.opt.progress_every_s
            self._observe()
            self.book.sample()
            self.stop.wait(0.25)
        self._progress()

    def _observe(self) -> None:
        """Called about four times a second while the load runs: a place for a longer run
        (``surplus soak``) to watch the processes; the demo itself has nothing to add."""

    def _progress(self) -> None:
        now = wall_ms()
        t = (now - self.start_ms) / 1000.0
        phase = plan.phase_at(self.phases, t) if t >= 0 else ""
        self.say(progress_line(t, self.opt.duration_s, phase, self.out / "loadgen",
                               self.monitor, now, self.scenario.control.rma.sla_p99_ms))

    # -- the end ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        quick = self.hurry.is_set
        self.children.stop_one("loadgen", signal.SIGTERM, 5 if quick() else 40)
        if self.start_ms and not self.end_ms:
            self.end_ms = wall_ms()
        self.end_ms = max(self.start_ms, min(self.end_ms or wall_ms(), wall_ms()))
        self.children.stop_one("scheduler", signal.SIGTERM, 5 if quick() else 20)
        self.book.pending = []
        with contextlib.suppress(OSError):
            self.book.sample(force=True)
        self._scrape_workers()
        workers = [r.worker_id for r in getattr(self, "replicas", [])]
        for name in workers:
            if name in self.children:
                self.children[name].send(signal.SIGTERM)
        for name in workers:
            self.children.stop_one(name, signal.SIGTERM, 5 if quick() else 30)
        left = self.book.close()
        if left:
            self.say(f"warning: CPU slices not removed (still in use?): {', '.join(left)}")
        self.children.stop_one("control-plane", signal.SIGTERM, 5 if quick() else 30)
        if "recorder" in self.children and not quick():
            time.sleep(1.5)  # let the recorder read the last revokes and reports
        self.children.stop_one("recorder", signal.SIGINT, 5 if quick() else 30)
        self.children.stop_one("prometheus", signal.SIGTERM, 10)
        if self.monitor is not None:
            self.monitor.stop()
        if self.broker_dir is not None:
            localkafka.down(self.broker_dir)
            self.say("kafka: embedded broker stopped")
            with contextlib.suppress(OSError):  # its pauses, for the report (see BROKER_GC_LOG)
                shutil.copyfile(self.broker_dir / localkafka.GC_LOG,
                                self.out / report.BROKER_GC_LOG)
        left = self.children.alive()
        if left:
            self.say(f"warning: still running after shutdown: {', '.join(left)}")

    def _scrape_workers(self) -> None:
        """Each worker's /metrics text, for the preemption reaction histogram (with those of
        replicas already taken back)."""
        texts = dict(self.book.scraped)
        for name in getattr(self, "ports", Ports(0, 0, 0, {})).workers:
            child = self.children.get(name)
            text = self._scrape(name) if child is not None and child.alive() else None
            if text is not None:
                texts[name] = text
        if texts:
            (self.out / "worker_metrics.json").write_text(json.dumps(texts))

    def _scrape(self, worker_id: str) -> str | None:
        return metrics_text(self.ports.workers[worker_id])

    def _write_report(self) -> None:
        if not self.start_ms or not hasattr(self, "scenario"):
            return
        info = run_info(self.scenario, self.phases, self.replicas, self.start_ms,
                        self.end_ms or wall_ms(), self.opt.duration_s,
                        interrupted=self.stop.is_set(),
                        kafka="embedded" if self.broker_dir else "external",
                        endpoints=self._endpoints(),
                        replica_changes=self.book.log,
                                slices=self.book.slices_info())
        (self.out / "run.json").write_text(json.dumps(asdict(info), indent=2) + "\n")
        try:
            summary = report.build(self.out)
        except Exception as exc:  # a report problem must not hide the run's own outcome
            self.say(f"report: could not be built: {type(exc).__name__}: {exc}")
            self.error = self.error or f"report failed: {exc}"
            return
        self.say(verdict(summary))
        self.say(f"report: {self.out / 'report.html'}  summary: {self.out / 'summary.json'}  "
                 f"event log: {self.out / report.EVENT_LOG}")

    def _endpoints(self) -> dict[str, int]:
        p = self.ports
        return {"control-plane": p.control, "scheduler": p.scheduler, "loadgen": p.loadgen,
                **p.workers, **({"prometheus": self.prometheus_port}
                               if self.prometheus_port else {})}

