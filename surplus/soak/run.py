"""A soak: a demo run (``surplus.demo.run.Demo``: the same processes, started, watched and
stopped the same way) under the soak scenario, with every process sampled while the load runs.

Every ``interval_s`` it reads each process's RSS, open fds and threads from ``/proc``, and the
control plane's and workers' /metrics for consumer lag and targets age; each sample is a line
of ``samples.jsonl``. Once the load is over (before anything is stopped, so the end is the
system at work, not shutting down) the samples after the warm-up are judged (``growth``):
``summary.json`` and ``soak.txt`` (the table) say per process where each measure started and
ended, and the run fails, naming the process and the measure, if one grew by more than the
bound or a process was replaced during the run. The demo's own report is in ``demo/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from schemas.clock import wall_ms
from surplus import localkafka
from surplus.demo.options import DemoOptions
from surplus.demo.run import Demo
from surplus.live.procs import metrics_text
from surplus.soak import growth, probe, verdict

DEFAULT_SCENARIO = "soak"
LAG = ("consumer_lag",)
FLOW = ("consumer_lag", "targets_age_s")


@dataclass(frozen=True)
class SoakOptions:
    out: Path
    minutes: float = 30.0
    warmup_s: float | None = None
    interval_s: float = 5.0
    bound: float = 0.10
    scenario: str = DEFAULT_SCENARIO
    bootstrap: str | None = None
    prefix: str | None = None
    rate: float | None = None

    @property
    def duration_s(self) -> float:
        return self.minutes * 60.0

    @property
    def warmup(self) -> float:
        return default_warmup_s(self.duration_s) if self.warmup_s is None else self.warmup_s


@contextlib.contextmanager
def resident_jvm_heap() -> Iterator[None]:
    """The embedded broker's JVM touches its whole initial heap at start (``AlwaysPreTouch``,
    through ``JAVA_TOOL_OPTIONS``, which every JVM reads and nothing else does).

    Without it, a JVM's RSS climbs for a quarter of an hour or more at the demo's load while
    the collector first writes to heap pages it reserved at start (measured: 274 -> 313 MiB
    in the first five minutes, old generation filling towards its committed 170 MiB), which
    would read as growth and is none. With the heap resident, the broker's RSS grows only if
    the heap itself must (live data past what it was given) or memory outside it does: both
    are what a soak is after."""
    before = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{before or ''} -XX:+AlwaysPreTouch".strip()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = before


def default_warmup_s(duration_s: float) -> float:
    """A fifth of the run, within 1 to 5 minutes: long enough for the harvested replicas to
    start and warm their models up, for the caches and pools of every process to fill, and
    for the broker's heap to be touched through (5 minutes of a 30-minute run)."""
    return min(300.0, max(60.0, 0.2 * duration_s))


class Soak(Demo):
    """One soak; ``run()`` returns the exit status (0: nothing grew, 1: something did or the
    run failed, 130: interrupted)."""

    def __init__(self, options: SoakOptions, say: Callable[[str], None] = print) -> None:
        super().__init__(DemoOptions(
            out=options.out / "demo", duration_s=options.duration_s, scenario=options.scenario,
            bootstrap=options.bootstrap, prefix=options.prefix, rate=options.rate,
            progress_every_s=30.0), say)
        self.soak = options
        self.samples: list[dict[str, Any]] = []
        self._next_sample = 0.0
        self._samples_path = options.out / "samples.jsonl"

    def run(self) -> int:
        self.soak.out.mkdir(parents=True, exist_ok=True)
        for name in ("samples.jsonl", "summary.json", "soak.txt"):
            (self.soak.out / name).unlink(missing_ok=True)
        self.say(f"soak: {self.soak.minutes:g} min of load, warm-up {self.soak.warmup:.0f} s, "
                 f"a sample every {self.soak.interval_s:g} s, bound +{self.soak.bound:.0%}")
        with resident_jvm_heap():
            code = super().run()
        if not self.samples:
            return code or 1
        summary = self._summary(code)
        verdict.write(self.soak.out, summary, self.say)
        if code:
            return code
        return 0 if summary["ok"] else 1

    # -- while the load runs ---------------------------------------------------------------

    def _observe(self) -> None:
        if time.monotonic() >= self._next_sample:
            self._next_sample = time.monotonic() + self.soak.interval_s
            self._sample()

    def _watch(self) -> None:
        super()._watch()
        self._sample()  # the end: the system still at work

    def _sample(self) -> None:
        processes: dict[str, dict[str, Any]] = {}
        for name, pid, port in self._watched():
            held = probe.resources(pid)
            if held is None:
                continue
            entry: dict[str, Any] = {"pid": pid, **asdict(held)}
            text = metrics_text(port) if port else None
            if text is not None:
                entry.update(probe.flow(text))
            processes[name] = entry
        line = {"t_s": round((wall_ms() - self.start_ms) / 1000.0, 1), "processes": processes}
        self.samples.append(line)
        with self._samples_path.open("a") as fh:
            fh.write(json.dumps(line) + "\n")

    def _watched(self) -> list[tuple[str, int, int | None]]:
        """(name, pid, metrics port or None) of every process of the run that is up now."""
        found: list[tuple[str, int, int | None]] = []
        broker = localkafka.status(self.broker_dir) if self.broker_dir else None
        if broker is not None:
            found.append(("broker", broker.pid, None))
        ports = {"control-plane": self.ports.control, **self.ports.workers}
        for name, child in self.children.items():
            if name != "prometheus" and child.alive() and child.pid is not None:
                found.append((name, child.pid, ports.get(name)))
        return found

    # -- the verdict -----------------------------------------------------------------------

    def _expected(self) -> dict[str, tuple[str, ...]]:
        """Every process and what is judged of it."""
        expected: dict[str, tuple[str, ...]] = {}
        if self.broker_dir is not None:
            expected["broker"] = growth.RESOURCES
        expected["control-plane"] = growth.RESOURCES + LAG
        for replica in getattr(self, "replicas", []):
            expected[replica.worker_id] = growth.RESOURCES + FLOW
        for name in ("scheduler", "loadgen", "recorder"):
            expected[name] = growth.RESOURCES
        return expected

    def _summary(self, code: int) -> dict[str, Any]:
        opt = self.soak
        summary = verdict.summarize(self.samples, self._expected(), duration_s=opt.duration_s,
                                    warmup_s=opt.warmup, interval_s=opt.interval_s,
                                    bound=opt.bound,
                                    period_s=self.scenario.control.period_ms / 1000.0)
        if code:
            summary["failures"].append(verdict.RUN_FAILED.format(code=code, logs=self.out))
            summary["ok"] = False
        return {**summary, "minutes": opt.minutes, "scenario": self.scenario.name,
                "start_ms": self.start_ms, "demo": _demo_headline(self.out / "summary.json")}


def _demo_headline(path: Path) -> dict[str, Any]:
    """The demo report's numbers of record that a soak also answers for."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    keys = ("baseline_requests_total", "baseline_requests_failed",
            "baseline_sla_violation_windows", "baseline_windows_judged", "optional_units_done")
    return {k: summary.get(k) for k in keys}
