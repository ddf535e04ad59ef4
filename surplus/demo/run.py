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
options and ports by ``options``; Kafka and its topics by ``broker``; each process's command
line by ``commands``; Prometheus by ``prometheus``; the files a run writes for its processes
and its report (worker config, ``run.json``, the verdict line, the scrape config) by
``runinfo``; the order of step 6 by ``shutdown``; what the run leaves for its reader by
``outcome``.

A Ctrl-C or SIGTERM at any point jumps to step 6 with what exists; a second one shortens the
waits. Every child runs in its own session with a parent-death signal, so none outlives the run.
"""


from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schemas.clock import wall_ms
from schemas.kafka_config import KafkaSettings
from sim import schedule
from sim.scenario import ScenarioError
from surplus import localkafka
from surplus.demo import broker, commands, outcome, prometheus, report, runinfo, shutdown
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
from surplus.live.procs import Child, metrics_text

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
        outcome.clear(self.out)
        (self.out / "control.toml").write_text(plan.control_toml(self.scenario))
        self.keys = signing_dir(self.out)
        self.ports = Ports.free(self.replicas)
        self.say(f"demo: scenario {self.scenario.name}, {self.opt.duration_s:.0f}s of load, "
                 f"{len(self.replicas)} workers "
                 f"({', '.join(r.worker_id for r in self.replicas)}); output in {self.out}")

    # -- Kafka -----------------------------------------------------------------------------

    def _connect(self) -> None:
        bootstrap = broker.given(self.opt.bootstrap, self.say)
        if bootstrap is None:
            self.broker_dir = self.state / "kafka"
            bootstrap = broker.embedded(self.broker_dir, self.say)
        self.kafka = broker.with_topics(bootstrap, self.opt.prefix or DEFAULT_PREFIX, self.say,
                                        self.stop)

    # -- processes -------------------------------------------------------------------------

    def _start_recorder(self) -> None:
        assert self.kafka is not None
        self.children.launch("recorder", commands.recorder(self.out / report.EVENT_LOG,
                                                           wall_ms() - 1000, self.kafka))

    def _start_control_plane(self) -> None:
        assert self.kafka is not None
        self.children.launch("control-plane", commands.control_plane(
            self.kafka, self.keys, config=self.out / "control.toml", port=self.ports.control,
            data_dir=self.state / "control"))
        self.monitor = Monitor(self.kafka, self.scenario.control.period_ms)
        self.monitor.start()

    def _start_workers(self) -> None:
        """Every worker gets its process description now; the provisioned ones start now, the
        opportunistic ones whose capacity follows a schedule when it lends them (each in its
        CPU slice where the host allows, see ``ReplicaBook.open_slices``)."""
        assert self.kafka is not None
        config = self.out / "worker.toml"
        config.write_text(plan.to_toml(runinfo.worker_tree(self.scenario, self.replicas)))
        managed = plan.managed_replicas(self.changes)
        made = self.book.open_slices(self.replicas)
        plant = self.scenario.precompute
        for r in self.replicas:
            cpu = made.get(r.worker_id)
            precompute = (plant.enabled and r.tier == "opportunistic"
                          and r.model in plant.models)
            self.children[r.worker_id] = Child(r.worker_id, commands.worker(
                self.kafka, self.keys, config=config, replica=r,
                port=self.ports.workers[r.worker_id], precompute=precompute),
                self.out / "logs",
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
        self.children.wait_ready(name, port, timeout_s, self.stop)
        if name == "control-plane":
            self.say("control plane: ready")

    def _start_load(self) -> None:
        assert self.kafka is not None
        self.start_ms = wall_ms() + int(LEAD_S * 1000)
        self.end_ms = self.start_ms + int(self.opt.duration_s * 1000)
        times = commands.timeline(self.opt.scenario, self.opt.duration_s, self.start_ms)
        self.children.launch("scheduler", commands.scheduler(times, self.kafka, self.keys,
                                                             port=self.ports.scheduler))
        self.children.launch("loadgen", commands.loadgen(
            times, self.kafka, self.keys, rate=self.opt.rate, out=self.out / "loadgen",
            port=self.ports.loadgen))
        self.book.start_ms = self.start_ms
        self.book.pending = list(self.changes)
        if self.opt.prometheus:
            self.prometheus_port = prometheus.start(self.children, self.ports, self.replicas,
                                                    out=self.out, state=self.state, say=self.say)
        self.say(f"load: starts in {LEAD_S:.0f}s and runs {self.opt.duration_s:.0f}s; "
                 "phases: " + ", ".join(f"{p.name} {p.start_s:.0f}-{p.end_s:.0f}s"
                                        for p in self.phases))

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
        shutdown.stop_after_load(
            self.children, self.book, [r.worker_id for r in getattr(self, "replicas", [])],
            scrape=self._scrape, endpoints=list(getattr(self, "ports", Ports(0, 0, 0, {})).workers),
            out=self.out, quick=quick, say=self.say)
        if self.monitor is not None:
            self.monitor.stop()
        plant = getattr(self, "scenario", None) and self.scenario.precompute
        if plant and plant.enabled and self.kafka is not None and self.start_ms and not quick():
            shutdown.audit_precompute(self.kafka, self.region.name, list(plant.models),
                                      self.out, self.end_ms - self.start_ms, self.say)
        if self.broker_dir is not None:
            shutdown.stop_broker(self.broker_dir, self.out, self.say)
        left = self.children.alive()
        if left:
            self.say(f"warning: still running after shutdown: {', '.join(left)}")

    def _scrape(self, worker_id: str) -> str | None:
        return metrics_text(self.ports.workers[worker_id])

    def _write_report(self) -> None:
        if not self.start_ms or not hasattr(self, "scenario"):
            return
        info = run_info(self.scenario, self.phases, self.replicas, self.start_ms,
                        self.end_ms or wall_ms(), self.opt.duration_s,
                        interrupted=self.stop.is_set(),
                        kafka="embedded" if self.broker_dir else "external",
                        endpoints=outcome.endpoints(self.ports, self.prometheus_port),
                        replica_changes=self.book.log, slices=self.book.slices_info())
        self.error = self.error or outcome.write(self.out, info, self.say)
