"""A small Surplus deployment on loopback for fault tests: a control plane, baseline and
powerful workers (real processes), opportunistic capacity granted, and ranking load through the
client library. Each fault test breaks one piece of it and measures what the rest did;
`surplus chaos` breaks several, at random.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring, load_keyring
from surplus.fleet.load import LoadRunner, Window
from surplus.fleet.procs import (
    POWERFUL_POOL,
    RMA_POOL,
    ControlProc,
    Proc,
    WorkerProc,
    control_toml,
    grant,
    metric,
)


@dataclass
class Fleet:
    """Start with `start()`, always `stop()`; `figures` collects the lines a test prints."""

    tmp_path: Path
    kafka: KafkaSettings
    baseline: int = 1
    powerful: int = 1
    ttl_s: float = 6.0
    rate_rps: float = 40.0
    extra: int = 24
    deadline_ms: float = 250.0
    worker_overrides: dict[str, dict[str, object]] = field(default_factory=dict)
    control_extra: str = ""
    #: `--instance-id` of the first control plane (static group membership), if any.
    control_instance: str | None = None
    #: A key file or key directory every process is given (`--signing-key-file`): grants,
    #: targets, notices and the load's client signed and checked with it.
    signing_keys: Path | None = None
    #: The URL the load's client calls a worker at (default its own: `surplus chaos` puts a
    #: toxiproxy proxy in front of each).
    route: Callable[[WorkerProc], str] | None = None
    #: More `LoadRunner` keyword arguments (labels, a recorder).
    load_options: dict[str, Any] = field(default_factory=dict)
    workers: dict[str, WorkerProc] = field(default_factory=dict)
    controls: list[ControlProc] = field(default_factory=list)
    load: LoadRunner | None = None
    started_s: float = 0.0

    @property
    def app_id(self) -> str:
        return f"{self.kafka.prefix}cp"

    @property
    def keyring(self) -> Keyring | None:
        return None if self.signing_keys is None else load_keyring(self.signing_keys)

    def _key_args(self) -> list[str]:
        return [] if self.signing_keys is None else ["--signing-key-file",
                                                     str(self.signing_keys)]

    def control_plane(self, name: str, args: list[str] | None = None,
                      **kw: object) -> ControlProc:
        proc = ControlProc(self.tmp_path, name, self.kafka, app_id=self.app_id,
                           config=control_toml(self.tmp_path, ttl_s=self.ttl_s,
                                               extra=self.control_extra),
                           args=[*(args or []), *self._key_args()],
                           **kw)  # type: ignore[arg-type]
        self.controls.append(proc)
        return proc

    def start(self) -> Fleet:
        """Processes in parallel, then capacity, then load; returns once load runs."""
        t0 = time.monotonic()
        self.control_plane("cp", args=["--instance-id", self.control_instance]
                           if self.control_instance else None)
        for i in range(self.baseline):
            self._worker(f"b{i + 1}", "baseline", "baseline")
        for i in range(self.powerful):
            self._worker(f"p{i + 1}", "opportunistic", "powerful")
        for worker in self.workers.values():
            worker.wait_ready()
        self.grant(RMA_POOL)
        if self.powerful:
            self.grant(POWERFUL_POOL)
        route = self.route or (lambda w: w.url)
        self.load = LoadRunner(
            baseline_urls=[route(w) for w in self.baseline_workers()],
            powerful_urls=[route(w) for w in self.powerful_workers()], kafka=self.kafka,
            rate_rps=self.rate_rps, extra=self.extra, deadline_ms=self.deadline_ms,
            signing_key=self.keyring, **self.load_options).start()
        self.started_s = time.monotonic() - t0
        return self

    def grant(self, pool: str) -> None:
        """The scheduler's grant of the fleet's opportunistic capacity to ``pool`` (RMA's or
        the powerful pool), signed where the fleet has keys."""
        units, cpu = (4.0, 32.0) if pool == RMA_POOL else (8.0, 64.0)
        grant(self.kafka, pool, units=units, cpu=cpu, key=self.keyring)

    def _worker(self, name: str, tier: str, model: str,
                env: dict[str, str] | None = None) -> WorkerProc:
        kw = dict(self.worker_overrides.get(name, {}))
        kw["args"] = [*kw.get("args", []), *self._key_args()]  # type: ignore[misc]
        if env is not None:
            kw["env"] = {**kw.get("env", {}), **env}  # type: ignore[dict-item]
        worker = WorkerProc(self.tmp_path, name, tier=tier, model=model, kafka=self.kafka,
                            **kw)  # type: ignore[arg-type]
        self.workers[name] = worker
        return worker

    def restart_worker(self, name: str, env: dict[str, str] | None = None,
                       timeout_s: float = 60.0, *, draining_ok: bool = False) -> WorkerProc:
        """A new process for worker ``name`` (the old one stopped or killed before), on a new
        port, with ``env`` added (e.g. its clock set off); returns it once ready (or serving
        while draining, with ``draining_ok``: see `WorkerProc.wait_ready`)."""
        old = self.workers[name]
        old.stop()
        tier, model = (("baseline", "baseline") if name.startswith("b")
                       else ("opportunistic", "powerful"))
        worker = self._worker(name, tier, model, env)
        worker.wait_ready(timeout_s, draining_ok=draining_ok)
        return worker
    def baseline_workers(self) -> list[WorkerProc]:
        return [w for n, w in sorted(self.workers.items()) if n.startswith("b")]

    def powerful_workers(self) -> list[WorkerProc]:
        return [w for n, w in sorted(self.workers.items()) if n.startswith("p")]

    @property
    def runner(self) -> LoadRunner:
        assert self.load is not None, "Fleet.start() first"
        return self.load

    def warm_up(self, timeout_s: float = 60.0, rma: bool = True, sbm: bool = True) -> float:
        """Wait until optional work flows: RMA extra candidates scored, and requests served by
        the powerful pool when there is one; returns the load time at which it did."""
        deadline = time.monotonic() + timeout_s
        sbm = sbm and self.powerful > 0
        while time.monotonic() < deadline:
            self.assert_alive()
            recent = self.runner.window(max(0.0, self.runner.now() - 3.0))
            if (not rma or recent.optional_done > 0) and (not sbm or recent.served_powerful):
                return self.runner.now()
            time.sleep(0.5)
        recent = self.runner.window(max(0.0, self.runner.now() - 3.0))
        raise AssertionError(f"optional work never started: {recent.line('last 3 s')}\n"
                             f"{self.runner.client_summary()}\n"
                             + "\n".join(p.output()[-1500:] for p in self.procs()))

    def procs(self) -> list[Proc]:
        return [*self.controls, *self.workers.values()]

    def assert_alive(self, *except_: Proc) -> None:
        for proc in self.procs():
            if proc not in except_:
                assert proc.alive(), f"{proc.log_path.name} died:\n{proc.output()[-3000:]}"

    def worker_metric(self, name: str, metric_name: str, **labels: str) -> float:
        return metric(self.workers[name].metrics(), metric_name, **labels)

    def wait_for(self, what: str, check: object, timeout_s: float, poll_s: float = 0.1) -> float:
        """Seconds until `check()` is true (fails the test after `timeout_s`)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if check():  # type: ignore[operator]
                return time.monotonic() - started
            time.sleep(poll_s)
        raise AssertionError(f"{what}: not within {timeout_s}s")

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        for proc in self.procs():
            proc.stop()


def figures_of(window: Window) -> dict[str, object]:
    """A window as the dict a test prints and asserts on."""
    return {"seconds": round(window.seconds, 1), "sent": window.sent, "served": window.served,
            "rps": round(window.rps, 1), "baseline_lost": dict(window.lost),
            "p50_ms": round(window.baseline_p50_ms, 1),
            "p99_ms": round(window.baseline_p99_ms, 1),
            "ranking_p99_ms": round(window.ranking_p99_ms, 1),
            "routed_powerful_max_ms": round(window.routed_powerful_max_ms, 1),
            "optional_done": window.optional_done,
            "optional_per_s": round(window.optional_per_s),
            "optional_shed": dict(window.optional_shed),
            "powerful_served": window.served_powerful, "fallbacks": dict(window.fallbacks)}
