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

A Ctrl-C or SIGTERM at any point jumps to step 6 with what exists; a second one shortens the
waits. Every child runs in its own session with a parent-death signal, so none outlives the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from schemas.clock import wall_ms
from schemas.kafka_config import KafkaSettings
from schemas.topics import SCOPE_PARTITIONS
from sim import schedule
from sim.scenario import Scenario, ScenarioError
from surplus import localkafka
from surplus.demo import report, slices
from surplus.demo.analysis import RunInfo
from surplus.demo.monitor import Monitor, last_line
from surplus.live import plan
from surplus.live.procs import Child, metrics_text, wait_until

DEFAULT_PREFIX = "surplus.demo."
APP_ID = "surplus-demo-control"
LEAD_S = 8.0
"""Seconds between launching the scheduler and load generator and the start of their timeline."""
BACKGROUND = frozenset({"control-plane", "recorder", "prometheus"})
"""Children off the serving path and the preemption path: on the demo's shared cores they run
at ``DemoOptions.background_nice``, so a burst of their work (a control tick, a batch of
labels) waits for the workers, the broker and the load rather than delaying a notice or a
baseline request. In a deployment they would not share the serving replicas' cores at all."""


class DemoError(RuntimeError):
    """The run cannot go on; the message says which part failed and why."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: stop starting things and shut down."""


@dataclass(frozen=True)
class DemoOptions:
    out: Path
    duration_s: float = 180.0
    scenario: str = plan.DEFAULT_SCENARIO
    bootstrap: str | None = None
    prefix: str | None = None
    prometheus: bool = False
    rate: float | None = None
    progress_every_s: float = 5.0
    background_nice: int = 10
    """Niceness of the ``BACKGROUND`` children (0: as the rest)."""
    provisioned_nice: int = -5
    """Niceness of the provisioned (baseline-tier) replicas. On a fleet they run on hardware
    of their own; on the demo's shared cores they stand for it, so they come first: at the
    moment of a reclaim the broker, the dying replicas' goodbyes, the control plane and the
    load generator all wake at once, and a provisioned replica at niceness 0 on a busy
    two-core host waited up to 60 ms behind them (a baseline request over the SLA that no
    optional work caused). A negative niceness needs root (CAP_SYS_NICE); elsewhere the
    replica runs at 0 and the run says so."""
    opportunistic_nice: int = 5
    """Niceness of the opportunistic replicas (0: as the provisioned ones). Harvested
    capacity is best-effort: on the demo's shared cores a burst of optional work on a lent
    replica must not take the CPU from the provisioned replica's baseline work. On a fleet the
    lent replicas run on hardware of their own. In a CPU slice the quota is what bounds it
    instead: the slice weighs as a nice-0 process, so on a busy host it still gets the quota
    it was lent (a lent slice is its own, as on a fleet), and the niceness only orders the
    replica's threads among themselves."""
    cores_per_unit: float = 0.5
    """CPU cores one lent unit of the demo's ``cpu`` accelerator is: each opportunistic
    replica runs in a CPU slice of its grant's units (one per replica) times this, so what is
    lent bounds what the replica can do. 0.5 leaves the provisioned replica, the broker, the
    control plane and the load generator a core of a two-core machine between them."""
    slice_period_us: int = slices.DEFAULT_PERIOD_US
    """The slices' quota period (see ``slices.DEFAULT_PERIOD_US``)."""
    slices: bool = True
    """Run the opportunistic replicas in CPU slices (cgroups) where this host allows it."""


@dataclass
class Ports:
    control: int
    scheduler: int
    loadgen: int
    workers: dict[str, int]


class Demo:
    """One run; ``run()`` returns the process exit status (0 done, 1 failed, 130 interrupted)."""

    def __init__(self, options: DemoOptions, say: Callable[[str], None] = print) -> None:
        self.opt = options
        self.say = say
        self.out = options.out
        self.stop = threading.Event()
        self.hurry = threading.Event()
        self.children: dict[str, Child] = {}
        self.broker_dir: Path | None = None
        self.state = Path(tempfile.mkdtemp(prefix="surplus-demo-"))
        self.monitor: Monitor | None = None
        self.kafka: KafkaSettings | None = None
        self.start_ms = 0
        self.end_ms = 0
        self.error: str | None = None
        self.prometheus_port = 0
        #: Replica changes still to come, and those done: (seconds into the run, worker, what).
        self.pending: list[plan.ReplicaChange] = []
        self.replica_log: list[tuple[float, str, str]] = []
        #: Workers expected not to run now (not lent yet, or taken back).
        self.offline: set[str] = set()
        #: /metrics of replica processes already taken back, by ``worker_id#n``.
        self.scraped: dict[str, str] = {}
        #: The opportunistic replicas' CPU slices, and what is known of each replica's life:
        #: how many it has had, and whether the current one serves its lent capacity.
        self.cpu = slices.CpuSlices(0, "not opened")
        self.lives: dict[str, int] = {}
        self.serving: dict[str, bool] = {}
        self.next_sample = 0.0

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
        self.keys = self._signing_keys()
        free = localkafka.free_port
        self.ports = Ports(control=free(), scheduler=free(), loadgen=free(),
                           workers={r.worker_id: free() for r in self.replicas})
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
            localkafka.fetch_jars()
            self.broker_dir = self.state / "kafka"
            info, _ = localkafka.up(port=localkafka.free_port(), data_dir=self.broker_dir)
            bootstrap = info.bootstrap
            self.say(f"kafka: embedded broker at {bootstrap} (pid {info.pid}, ready in "
                     f"{info.started_in_s or 0:.1f}s)")
        try:
            self.kafka = KafkaSettings(bootstrap=bootstrap,
                                       prefix=self.opt.prefix or DEFAULT_PREFIX)
        except ValueError as exc:
            raise DemoError(f"bad Kafka settings: {exc}") from None
        from surplus.topics import apply_topics

        try:
            applied = apply_topics(self.kafka.confluent(), self.kafka.prefix)
        except Exception as exc:
            raise DemoError(f"cannot apply topics on {bootstrap}: {exc}") from None
        if not applied.ok:
            raise DemoError("existing topics disagree with the catalog: "
                            + "; ".join(applied.mismatches))
        self.say(f"topics: {len(applied.created)} created, {len(applied.existing)} existing "
                 f"(prefix {self.kafka.prefix!r})")
        if not wait_until(partial(topics_serve, self.kafka), 60.0, 0.5, stop=self.stop.is_set):
            self._check()
            raise DemoError(f"the new topics on {bootstrap} have no serving leaders after 60s")

    def _kafka_args(self) -> list[str]:
        assert self.kafka is not None
        return ["--bootstrap", self.kafka.bootstrap, "--prefix", self.kafka.prefix]

    def _signing_keys(self) -> Path:
        """A key of this run's own, in a key directory every process is given: the control
        plane signs targets and checks the scheduler's grants and notices, the scheduler
        signs them, workers and the load's client check all they read (docs/security.md)."""
        keys = self.out / "keys"
        shutil.rmtree(keys, ignore_errors=True)
        keys.mkdir(parents=True)
        key = keys / "demo"
        key.write_text(secrets.token_hex(32))
        key.chmod(0o600)
        return keys

    def _signing_args(self) -> list[str]:
        return ["--signing-key-file", str(self.keys)]

    # -- processes -------------------------------------------------------------------------

    def _start(self, name: str, args: list[str], program: list[str] | None = None) -> Child:
        nice = self.opt.background_nice if name in BACKGROUND else 0
        child = Child(name, args, self.out / "logs", program=program, nice=nice).start()
        self.children[name] = child
        return child

    def _start_recorder(self) -> None:
        since = wall_ms() - 1000
        self._start("recorder", ["record", "--out", str(self.out / report.EVENT_LOG),
                                 "--from", f"time:{since}", "--quiet", *self._kafka_args()])

    def _start_control_plane(self) -> None:
        assert self.kafka is not None
        self._start("control-plane", [
            "control-plane", *self._kafka_args(), "--config", str(self.out / "control.toml"),
            "--app-id", APP_ID, "--partitions", str(SCOPE_PARTITIONS),
            "--metrics-port", str(self.ports.control), "--data-dir", str(self.state / "control"),
            "--loglevel", "warning", *self._signing_args()])
        self.monitor = Monitor(self.kafka, self.scenario.control.period_ms)
        self.monitor.start()

    def _worker_config(self) -> Path:
        ranking = sum(1 for r in self.replicas if r.model == "baseline")
        tree = {"budget_share": round(1.0 / max(1, ranking), 6),
                "model": {"threads": 1, "warmup_rows": self.region.base_candidates
                          + self.region.max_extra_candidates,
                          **({"config": dict(self.scenario.worker.model)}
                             if self.scenario.worker.model else {})},
                "batching": {"max_wait_ms": 1.0},
                "admission": _builtins(self.scenario.worker.admission),
                "limits": _builtins(self.scenario.worker.limits)}
        path = self.out / "worker.toml"
        path.write_text(plan.to_toml(tree))
        return path

    def _open_slices(self) -> dict[str, slices.Slice]:
        """A CPU slice per opportunistic replica, of its grant's size (one unit each, see
        ``DemoOptions.cores_per_unit``); where this host allows none, the run goes on
        without and says why here and in its summary."""
        lent = [r for r in self.replicas if r.tier == "opportunistic"]
        if not lent:
            return {}
        if not self.opt.slices:
            self.cpu = slices.CpuSlices(0, "turned off (--no-slices)")
        else:
            self.cpu = slices.CpuSlices.open(f"surplus-demo-{os.getpid()}")
        made: dict[str, slices.Slice] = {}
        try:
            if self.cpu.version:
                quota = slices.quota_for(self.opt.cores_per_unit, self.opt.slice_period_us)
                weight = slices.nice_weight(0)
                made = {r.worker_id: self.cpu.make(r.worker_id, quota, weight) for r in lent}
        except slices.SliceError as exc:
            self.cpu.close()
            self.cpu = slices.CpuSlices(0, str(exc))
            made = {}
        if made:
            q = next(iter(made.values())).quota
            self.say(f"cpu slices ({self.cpu.mode}): each opportunistic replica gets "
                     f"{q.cores:g} cores ({q.quota_us} us every {q.period_us} us)")
        else:
            self.say(f"WARNING: no CPU slices ({self.cpu.reason}): the opportunistic replicas "
                     "share every core, so what is lent bounds nothing, and their busy share "
                     "is what they report, not a share of a quota")
        return made

    def _slices_info(self) -> dict[str, Any]:
        cores = {w: s.quota.cores for w, s in self.cpu.slices.items()}
        period = next(iter(self.cpu.slices.values())).quota.period_us if cores else None
        return {"mode": self.cpu.mode if cores else "none",
                **({"reason": self.cpu.reason or "no slice could be made"} if not cores else {}),
                "cores": cores, "period_us": period,
                "cores_per_unit": self.opt.cores_per_unit}

    def _sample_slices(self, *, force: bool = False,
                       ending: tuple[str, ...] = ()) -> None:
        """About once a second, each running slice's usage counter (``slices.jsonl``); a
        replica counts as lent from its readiness to its reclaim (``ending`` takes a last
        sample of those being reclaimed now, still lent)."""
        if not self.cpu.slices or (not force and time.monotonic() < self.next_sample):
            return
        self.next_sample = time.monotonic() + 1.0
        rows = []
        for worker_id, slice_ in self.cpu.slices.items():
            if worker_id not in self.lives:
                continue
            child = self.children.get(worker_id)
            lent = worker_id not in self.offline or worker_id in ending
            if lent and not self.serving.get(worker_id):
                self.serving[worker_id] = self._ready(self.ports.workers[worker_id], 0.5)
            try:
                usage = slice_.usage_usec()
            except (OSError, ValueError):
                continue
            rows.append({"t_s": round((wall_ms() - self.start_ms) / 1000.0, 3),
                         "mono_s": round(time.monotonic(), 4), "worker_id": worker_id,
                         "life": self.lives[worker_id], "usage_usec": usage,
                         "cores": slice_.quota.cores,
                         "lent": bool(lent and self.serving.get(worker_id)
                                      and child is not None)})
        if rows:
            with (self.out / report.SLICES).open("a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)

    def _start_workers(self) -> None:
        """Every worker gets its process description now; the provisioned ones start now, the
        opportunistic ones whose capacity follows a schedule when it lends them (each in its
        CPU slice where the host allows, see ``_open_slices``)."""
        config = self._worker_config()
        managed = plan.managed_replicas(self.changes)
        made = self._open_slices()
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
        self.offline = set(managed)
        for worker_id in now:
            self.children[worker_id].start()
            if worker_id in made:
                self.lives[worker_id] = 1
        self.say(f"workers: starting {', '.join(now)} (torch models load and warm up in each); "
                 f"{len(managed)} opportunistic replica(s) start when their capacity is lent")
        for worker_id in now:
            self._wait_ready(worker_id, self.ports.workers[worker_id], 180.0)
        self._check_alive()
        self._say_priority(now)
        self.say("workers: ready")

    def _say_priority(self, started: list[str]) -> None:
        """Say when a provisioned replica could not be given its niceness (not root): its
        baseline work then shares the CPU evenly with everything else on this host."""
        want = self.opt.provisioned_nice
        provisioned = {r.worker_id for r in self.replicas if r.tier != "opportunistic"}
        for worker_id in started:
            popen = self.children[worker_id].popen
            if not want or popen is None or worker_id not in provisioned:
                continue
            with contextlib.suppress(OSError):
                got = os.getpriority(os.PRIO_PROCESS, popen.pid) - os.getpriority(
                    os.PRIO_PROCESS, 0)
                if got != want:
                    self.say(f"note: {worker_id} runs at niceness {got:+d}, not {want:+d} "
                             "(needs root): its baseline work shares the CPU evenly")

    def _wait_ready(self, name: str, port: int, timeout_s: float) -> None:
        """Wait for a child's ``/readyz`` (a worker: model warm, Kafka read; the control plane:
        partitions assigned, state read back, ticking); fail with its log's tail."""
        ok = wait_until(partial(self._ready, port), timeout_s, 0.5, stop=self._stopping)
        self._check()
        self._check_alive()
        if not ok:
            raise DemoError(f"{name} not ready within {timeout_s:.0f}s:\n"
                            f"{self.children[name].tail()}")
        if name == "control-plane":
            self.say("control plane: ready")

    def _follow_replicas(self) -> None:
        """Start and take back opportunistic replicas whose time has come (from the watch loop:
        children are started from the main thread, whose end is their parent-death signal)."""
        now = wall_ms()
        while self.pending and self.start_ms + self.pending[0].at_ms <= now:
            change = self.pending.pop(0)
            (self._replica_up if change.up else self._replica_down)(change.worker_id)
            self.replica_log.append((round((wall_ms() - self.start_ms) / 1000.0, 3),
                                     change.worker_id, "started" if change.up else "reclaimed"))

    def _replica_up(self, worker_id: str) -> None:
        """Capacity lent: a new replica process starts (clients route to it once it announces
        itself serving). One still draining from its last reclaim is waited for first."""
        child = self.children[worker_id]
        if child.alive():
            child.stop(signal.SIGTERM, 10.0)
        child.start()
        self.offline.discard(worker_id)
        self.lives[worker_id] = self.lives.get(worker_id, 0) + 1
        self.serving[worker_id] = False
        self.say(f"replica {worker_id}: capacity lent, starting")

    def _replica_down(self, worker_id: str) -> None:
        """The notice's deadline: the owner takes the machine back. Scrape first (the reaction
        histogram lives in the process), then stop it as a reclaimed machine goes: it serves
        what it has queued and exits while the run goes on."""
        self.offline.add(worker_id)
        self._sample_slices(force=True, ending=(worker_id,))
        self.serving[worker_id] = False
        text = self._scrape(worker_id)
        if text is not None:
            self.scraped[f"{worker_id}#{len(self.scraped) + 1}"] = text
        self.children[worker_id].send(signal.SIGTERM)
        self.say(f"replica {worker_id}: capacity reclaimed, stopping")

    def _dead(self) -> list[str]:
        """Children that should be running and are not (the scheduler and the load generator
        may end on their own, status 0, when their timeline is over, a moment before ours)."""
        dead = []
        for name, child in list(self.children.items()):
            if child.popen is None or name in self.offline or name == "prometheus":
                continue
            if child.alive():
                continue
            if child.popen.poll() == 0 and name in ("scheduler", "loadgen"):
                continue
            dead.append(name)
        return dead

    def _stopping(self) -> bool:
        return self.stop.is_set() or bool(self._dead())

    def _ready(self, port: int, timeout_s: float = 2.0) -> bool:
        url = f"http://127.0.0.1:{port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _start_load(self) -> None:
        self.start_ms = wall_ms() + int(LEAD_S * 1000)
        self.end_ms = self.start_ms + int(self.opt.duration_s * 1000)
        timeline = ["--scenario", str(plan.scenario_path(self.opt.scenario)),
                    "--duration", str(self.opt.duration_s), "--start-at-ms", str(self.start_ms)]
        self._start("scheduler", ["scheduler", *timeline, "--metrics-port",
                                  str(self.ports.scheduler), *self._kafka_args(),
                                  *self._signing_args()])
        # The load generator's client routes from the replicas topic: a reclaimed replica says
        # it is draining when its notice arrives, before it goes; one starting is not there
        # until it serves.
        rate = ["--rate", str(self.opt.rate)] if self.opt.rate else []
        self._start("loadgen", ["loadgen", *timeline, "--membership", *rate, "--out",
                                str(self.out / "loadgen"), "--metrics-port",
                                str(self.ports.loadgen), *self._kafka_args(),
                                *self._signing_args()])
        self.pending = list(self.changes)
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
        self._start("prometheus", [f"--config.file={config}",
                                   f"--storage.tsdb.path={self.state / 'prometheus'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], program=[binary])
        self.say(f"prometheus: http://127.0.0.1:{port} (scraping {sum(map(len, targets.values()))}"
                 " endpoints every 2s)")

    # -- while it runs ---------------------------------------------------------------------

    def _watch(self) -> None:
        next_line = 0.0
        while wall_ms() < self.end_ms:
            self._check()
            self._follow_replicas()
            self._check_alive()
            if time.monotonic() >= next_line:
                self._progress()
                next_line = time.monotonic() + self.opt.progress_every_s
            self._observe()
            self._sample_slices()
            self.stop.wait(0.25)
        self._progress()

    def _observe(self) -> None:
        """Called about four times a second while the load runs: a place for a longer run
        (``surplus soak``) to watch the processes; the demo itself has nothing to add."""

    def _check_alive(self) -> None:
        """A child that died means the run is broken, and so does a keeper that failed."""
        for name in self._dead():
            child = self.children[name]
            status = child.popen.poll() if child.popen else None
            raise DemoError(f"{name} exited with status {status}:\n{child.tail()}")

    def _progress(self) -> None:
        now = wall_ms()
        t = (now - self.start_ms) / 1000.0
        if t < 0:
            self.say(f"[{t:6.1f}s] starting")
            return
        phase = plan.phase_at(self.phases, t)
        line = last_line(self.out / "loadgen" / "loadgen.jsonl") or {}
        parts = [f"[{t:5.0f}/{self.opt.duration_s:.0f}s {phase:8}]",
                 f"{line.get('requests', 0):3d} req/s"]
        mon = self.monitor
        if mon is not None:
            p99 = mon.ranking_p99(now)
            targets, done, shed, _ = mon.snapshot()
            sla = self.scenario.control.rma.sla_p99_ms
            parts.append("ranking p99 " + ("  -  " if p99 is None else f"{p99:5.1f}")
                         + f" ms (SLA {sla:g})")
            if targets is not None:
                parts.append(f"targets: extra {targets.rma.extra_candidates:3d} "
                             f"({targets.rma.limited_by or '-'}) "
                             f"coverage {targets.sbm.coverage:.2f} "
                             f"({targets.sbm.limited_by or '-'})")
            shed_total = sum(shed.values())
            top = ", ".join(f"{k} {v}" for k, v in sorted(shed.items(), key=lambda kv: -kv[1])
                            [:2])
            parts.append(f"optional done {done:,} shed {shed_total:,}"
                         + (f" ({top})" if top else ""))
        cuts = line.get("client_cuts", {})
        client_cut = sum(v for k, v in cuts.items() if not k.startswith("baseline_only"))
        parts.append(f"client cuts {client_cut:,}")
        parts.append(f"failed {self._failed()}")
        self.say(" | ".join(parts))

    def _failed(self) -> int:
        total = 0
        path = self.out / "loadgen" / "loadgen.jsonl"
        with contextlib.suppress(OSError, ValueError), path.open() as fh:
            for raw in fh:
                total += json.loads(raw).get("failed", 0)
        return total

    # -- the end ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        quick = self.hurry.is_set
        self._stop_child("loadgen", signal.SIGTERM, 5 if quick() else 40)
        if self.start_ms and not self.end_ms:
            self.end_ms = wall_ms()
        self.end_ms = max(self.start_ms, min(self.end_ms or wall_ms(), wall_ms()))
        self._stop_child("scheduler", signal.SIGTERM, 5 if quick() else 20)
        self.pending = []
        with contextlib.suppress(OSError):
            self._sample_slices(force=True)
        self._scrape_workers()
        workers = [r.worker_id for r in getattr(self, "replicas", [])]
        for name in workers:
            if name in self.children:
                self.children[name].send(signal.SIGTERM)
        for name in workers:
            self._stop_child(name, signal.SIGTERM, 5 if quick() else 30)
        left = self.cpu.close()
        if left:
            self.say(f"warning: CPU slices not removed (still in use?): {', '.join(left)}")
        self._stop_child("control-plane", signal.SIGTERM, 5 if quick() else 30)
        if "recorder" in self.children and not quick():
            time.sleep(1.5)  # let the recorder read the last revokes and reports
        self._stop_child("recorder", signal.SIGINT, 5 if quick() else 30)
        self._stop_child("prometheus", signal.SIGTERM, 10)
        if self.monitor is not None:
            self.monitor.stop()
        if self.broker_dir is not None:
            localkafka.down(self.broker_dir)
            self.say("kafka: embedded broker stopped")
            with contextlib.suppress(OSError):  # its pauses, for the report (see BROKER_GC_LOG)
                shutil.copyfile(self.broker_dir / localkafka.GC_LOG,
                                self.out / report.BROKER_GC_LOG)
        left = [name for name, child in self.children.items() if child.alive()]
        if left:
            self.say(f"warning: still running after shutdown: {', '.join(left)}")

    def _stop_child(self, name: str, sig: int, timeout_s: float) -> None:
        child = self.children.get(name)
        if child is None:
            return
        was_alive = child.alive()
        rc = child.stop(sig, timeout_s)
        if was_alive and rc not in (0, None, -sig, 128 + sig, 130):
            self.say(f"{name}: exited with status {rc} (log: {child.log_path})")

    def _scrape_workers(self) -> None:
        """Each worker's /metrics text, for the preemption reaction histogram (with those of
        replicas already taken back)."""
        texts = dict(self.scraped)
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
                        replica_changes=self.replica_log, slices=self._slices_info())
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


def topics_serve(kafka: KafkaSettings) -> bool:
    """Every partition of the logged topics answers an offsets-for-times query (what the
    recorder asks first): freshly created topics take a moment to get serving leaders."""
    from schemas import kafka_clients
    from streams.eventlog import TOPICS

    consumer = kafka_clients.consumer(kafka, "surplus-demo-probe", **{"enable.auto.commit": False})
    try:
        parts = []
        for logical in TOPICS:
            name = kafka.topic(logical)
            partitions = kafka_clients.partitions(consumer, name, timeout_s=5.0)
            parts += kafka_clients.starting_at(name, partitions, wall_ms())
        found = consumer.offsets_for_times(parts, timeout=5.0)
        return all(tp.error is None for tp in found)
    except (kafka_clients.KafkaException, kafka_clients.TopicUnavailable):
        return False
    finally:
        consumer.close()


def _builtins(struct: Any) -> dict[str, Any]:
    import msgspec

    value = msgspec.to_builtins(struct)
    assert isinstance(value, dict)
    return value


def run_info(scenario: Scenario, phases: list[plan.Phase], replicas: list[plan.Replica],
             start_ms: int, end_ms: int, duration_s: float, *, interrupted: bool,
             kafka: str, endpoints: dict[str, int],
             replica_changes: list[tuple[float, str, str]] | None = None,
             slices: dict[str, Any] | None = None) -> RunInfo:
    region = scenario.regions[0]
    return RunInfo(
        scenario=scenario.name, region=region.name, start_ms=start_ms, end_ms=end_ms,
        duration_s=duration_s, period_ms=scenario.control.period_ms,
        min_samples=scenario.control.min_samples, sla_p99_ms=scenario.control.rma.sla_p99_ms,
        sbm_sla_p99_ms=scenario.control.sbm.sla_p99_ms, base_candidates=region.base_candidates,
        phases=[(p.name, p.start_s, p.end_s) for p in phases],
        storms=plan.storm_windows(scenario), replicas=[r.worker_id for r in replicas],
        interrupted=interrupted, kafka=kafka,
        endpoints=endpoints, replica_changes=replica_changes or [],
        deadline_ms=region.deadline_ms, slices=slices or {})


def verdict(summary: dict[str, Any]) -> str:
    return (f"summary: {summary.get('baseline_requests_total', 0)} baseline requests, "
            f"{summary.get('baseline_requests_failed')} failed, "
            f"{summary.get('baseline_sla_violation_windows')} SLA-violation windows "
            f"({summary.get('baseline_windows_judged')} of "
            f"{summary.get('baseline_windows_total')} judged); opportunistic busy share "
            f"{summary.get('opportunistic_busy_share_lent')} "
            f"({(summary.get('cpu_slices') or {}).get('mode', 'none')} slices); "
            f"optional units done "
            f"{summary.get('optional_units_done', 0):,}, shed "
            f"{summary.get('optional_units_shed', 0):,}; incremental value "
            f"{summary.get('incremental_value')}; notice->shed p99 "
            f"{summary.get('notice_to_shed_p99_ms')} ms")


def prometheus_config(targets: dict[str, list[int]], pools: dict[int, str] | None = None) -> str:
    """A scrape config for the run's endpoints (job per kind of process). A worker's target
    carries its ``pool`` label, as compose's scrape config and the chart's ServiceMonitor set
    it: the dashboard tells opportunistic pools by it."""
    pools = pools or {}
    lines = ["global:", "  scrape_interval: 2s", "scrape_configs:"]
    for job, ports in targets.items():
        lines += [f"  - job_name: {job}", "    static_configs:"]
        plain = [p for p in ports if p not in pools]
        if plain:
            hosts = ", ".join(f"'127.0.0.1:{p}'" for p in plain)
            lines.append(f"      - targets: [{hosts}]")
        for port in (p for p in ports if p in pools):
            lines += [f"      - targets: ['127.0.0.1:{port}']",
                      f"        labels: {{pool: '{pools[port]}'}}"]
    return "\n".join(lines) + "\n"
