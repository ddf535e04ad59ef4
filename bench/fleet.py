"""A synthetic fleet against the real control plane: does it keep up, how fast are targets, what
does an event cost?

A generator process writes into a real broker what a fleet of ``replicas`` serving ``rps``
requests/s writes: one WindowReport per replica per report interval (one message each, as a
live worker sends it, the replicas' windows spread over the interval), the decision records its
clients log at sample rate ``sample`` (the holdout always, with its inclusion probability as
contract v9 says) in batches per client and linger, and one label per logged decision a little
later, batched the same way on its scope's partition. Only logged decisions are generated: an
unlogged request costs the control plane nothing. Messages are pre-encoded from templates and
produced in batches; if the generator cannot write at the asked rate, ``achieved_rps`` says so.

The control plane is ``processes`` real ``surplus control-plane`` processes in one consumer
group over ``partitions`` partitions; the fleet's requests and replicas are spread over
``regions`` scopes, named so that each lands on its own partition. With ``stages`` 1 a scope is
one partition and one process, so more processes only spread whole scopes; with ``stages`` 2
the reports are keyed by replica and every process sums its share of every scope (the first
stage), the scope's owner merging the parts (``streams.agents.stages``).

The result (its JSON object is the last line):

- ``keeps_up``: the group's consumer lag (messages, input topics, sampled every second from
  its committed offsets) does not grow over the second half of the run and ends bounded
  (`keeps_up`);
- ``targets_after_close_p99_s``: per scope and fleet window, from the window's close (its last
  report written) to the first targets of that scope published (message timestamp) once the
  control plane had counted every report of the window (`after_close_delays`);
- ``cpu_us_per_event``: the processes' CPU time (user + system, ``/proc``) over the events they
  took (reports, decision records and labels, from their ``/metrics``), after a warm-up;
- ``rss_mb_max``: the highest peak RSS (``VmHWM``) of a process;
- ``raw_cpu_us_per_event``: a confluent-kafka consume loop over the same topics in its own
  process doing the same work (strict decode, the scope's controller takes each event), its
  process CPU time over the same events: the floor.

    python -m bench.fleet --replicas 200 --rps 2000 --sample 0.1 --processes 2 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import broker
from bench.fleet_load import Shape, now_s
from bench.fleet_verdicts import after_close_delays, keeps_up, percentile

IDLE_S = 4.0


# ---- the raw floor (its own process) ------------------------------------------------------


def raw_floor(bootstrap: str, prefix: str, events: int, timeout_s: float = 60.0) -> dict[str,
                                                                                     Any]:
    """CPU µs per event of a plain consume loop over the input topics doing the same work
    (strict decode, the scope's controller takes each event), from the beginning."""
    from schemas import kafka_clients
    from schemas.codec import decode_labels, decode_outcomes, decode_telemetry
    from schemas.kafka_clients import OFFSET_BEGINNING
    from schemas.kafka_config import KafkaSettings
    from streams.control.config import ControlConfig
    from streams.control.controller import ScopeController

    kafka = KafkaSettings(bootstrap=bootstrap, prefix=prefix)
    consumer = kafka_clients.consumer(kafka, f"raw-{uuid.uuid4().hex}",
                                      **{"enable.auto.commit": False})
    assignment = []
    decoders: dict[str, Any] = {}
    for logical, decode, apply in (
            ("telemetry", decode_telemetry, ScopeController.on_report),
            ("outcomes", decode_outcomes, ScopeController.on_outcome),
            ("labels", decode_labels, ScopeController.on_label)):
        topic = kafka.topic(logical)
        decoders[topic] = (decode, apply)
        assignment += kafka_clients.starting_at(
            topic, kafka_clients.partitions(consumer, topic, timeout_s=10), OFFSET_BEGINNING)
    consumer.assign(assignment)
    controllers: dict[str, ScopeController] = {}
    config = ControlConfig()
    seen = 0
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    while seen < events and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            value = msg.value()
            if msg.error() or value is None:
                continue
            decode, apply = decoders[str(msg.topic())]
            now_ms = int(now_s() * 1000)
            for event in decode(value):
                scope = getattr(event, "region", None) or event.scope
                controller = controllers.get(scope)
                if controller is None:
                    controller = controllers[scope] = ScopeController(scope,
                                                                      config.for_scope(scope))
                apply(controller, event, now_ms)
                seen += 1
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    consumer.close()
    return {"events": seen, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "cpu_us_per_event": round(cpu / max(seen, 1) * 1e6, 2),
            "events_per_s": round(seen / max(wall, 1e-9))}


# ---- the run -------------------------------------------------------------------------------


def _child_json(code: str, timeout_s: float) -> dict[str, Any]:
    from surplus.localkafka import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


_METRIC = re.compile(rb"^(surplus_control_(?:reports|decisions|labels_received)_total) "
                     rb"([0-9.e+]+)$", re.M)
_MESSAGES = re.compile(rb'^surplus_control_events_total\{topic="(?:telemetry|outcomes|labels)"\} '
                       rb"([0-9.e+]+)$", re.M)


def _scrape(port: int) -> tuple[dict[str, float], float]:
    """A process's events taken, by kind, and its input messages (telemetry, outcomes and
    labels)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    return ({m.group(1).decode(): float(m.group(2)) for m in _METRIC.finditer(text)},
            sum(float(m.group(1)) for m in _MESSAGES.finditer(text)))


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Sampler(threading.Thread):
    """Samples the control plane while the fleet writes: each process's counters and CPU
    (every 0.2 s), the group's lag (every second) and the targets published."""

    def __init__(self, bootstrap: str, prefix: str, group: str, partitions: int,
                 procs: list[tuple[int, int]]) -> None:
        super().__init__(daemon=True)
        from schemas import kafka_clients
        from schemas.kafka_config import KafkaSettings

        self.kafka = KafkaSettings(bootstrap=bootstrap, prefix=prefix)
        self.procs = procs  # (pid, metrics port)
        self.stop = threading.Event()
        self.counts: list[tuple[float, float, float]] = []  # (t, reports, all events)
        self.cpu: list[tuple[float, float, float, float]] = []  # (t, cpu_s, events, msgs)
        self.cpu_by_process: list[tuple[float, list[float]]] = []  # (t, each one's cpu_s)
        self.lag: list[tuple[float, float]] = []
        self.targets: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self.lagger = kafka_clients.consumer(self.kafka, group,
                                             **{"enable.auto.commit": False})
        self.inputs = [kafka_clients.starting_at(self.kafka.topic(t), range(partitions), 0)
                       for t in ("telemetry", "outcomes", "labels")]
        self.watcher = kafka_clients.consumer(self.kafka, f"watch-{uuid.uuid4().hex}",
                                              **{"enable.auto.commit": False})
        topic = self.kafka.topic("targets")
        self.watcher.assign(kafka_clients.starting_at(
            topic, kafka_clients.partitions(self.watcher, topic, timeout_s=10),
            kafka_clients.OFFSET_BEGINNING))

    def _watch(self) -> None:
        from schemas.codec import decode
        from schemas.contract import ControlTargets

        while not self.stop.is_set():
            for msg in self.watcher.consume(500, 0.2):
                value = msg.value()
                if msg.error() or value is None:
                    continue
                targets = decode(ControlTargets, value)
                self.targets.setdefault(targets.scope, []).append(msg.timestamp()[1] / 1000)

    def _lag(self) -> float:
        lag = 0.0
        tps = [tp for group in self.inputs for tp in group]
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in self.lagger.committed(tps, timeout=5)}
        for tp in tps:
            _, high = self.lagger.get_watermark_offsets(tp, timeout=5, cached=False)
            done = committed.get((tp.topic, tp.partition), -1)
            lag += high - max(done, 0)
        return lag

    def run(self) -> None:
        watch = threading.Thread(target=self._watch, daemon=True)
        watch.start()
        last_lag = 0.0
        while not self.stop.is_set():
            now = now_s()
            try:
                scraped = [_scrape(port) for _, port in self.procs]
                each = [_proc_cpu_s(pid) for pid, _ in self.procs]
                cpu = sum(each)
                self.cpu_by_process.append((now, each))
                reports = sum(t.get("surplus_control_reports_total", 0.0) for t, _ in scraped)
                events = sum(sum(t.values()) for t, _ in scraped)
                self.counts.append((now, reports, events))
                self.cpu.append((now, cpu, events, sum(m for _, m in scraped)))
                if now - last_lag >= 1.0:
                    self.lag.append((now, self._lag()))
                    last_lag = now
            except Exception as exc:  # a sample lost is not the run lost
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            self.stop.wait(0.2)
        watch.join(5)
        self.watcher.close()
        self.lagger.close()


def _control_config(workdir: Path, period_s: float | None) -> list[str]:
    if period_s is None:
        return []
    path = workdir / "control.toml"
    path.write_text(f"period_s = {period_s}\n")
    return ["--config", str(path)]


def measure(bootstrap: str, shape: Shape, processes: int, seconds: float, workdir: Path,
            period_s: float | None) -> dict[str, Any]:
    from schemas.kafka_config import KafkaSettings
    from surplus.live.procs import Child, wait_until
    from surplus.localkafka import free_port
    from surplus.topics import apply_topics

    prefix = f"fleet{uuid.uuid4().hex[:6]}."
    kafka = KafkaSettings(bootstrap=bootstrap, prefix=prefix)
    apply_topics(kafka.confluent(), prefix, partitions_override=shape.partitions)
    group = f"{prefix}bench"
    config_args = _control_config(workdir, period_s)
    children: list[tuple[Child, int]] = []
    with ExitStack() as stack:
        for k in range(processes):
            port = free_port()
            child = Child(f"control-{k}", [
                "control-plane", "--bootstrap", bootstrap, "--prefix", prefix, "--app-id",
                group, "--partitions", str(shape.partitions), "--metrics-port", str(port),
                "--stages", str(shape.stages),
                "--data-dir", str(workdir / f"data-{k}"), *config_args], workdir).start()
            stack.callback(child.stop)
            children.append((child, port))
        ready = wait_until(lambda: all(_ready(port) for _, port in children)
                           and all(c.alive() for c, _ in children), timeout_s=60.0)
        if not ready:
            tails = "; ".join(c.tail(3) for c, _ in children)
            raise RuntimeError(f"control plane not ready in 60 s: {tails}")
        procs = [(c.pid or 0, port) for c, port in children]
        sampler = _Sampler(bootstrap, prefix, group, shape.partitions, procs)
        sampler.start()
        start = now_s() + IDLE_S  # the processes' idle cost is measured before it
        gen_args = {"bootstrap": bootstrap, "prefix": prefix, "shape": asdict(shape),
                    "seconds": seconds, "start_wall_s": start}
        written = _child_json("import json, bench.fleet_load as f; "
                              f"f._generator_main(json.loads({json.dumps(json.dumps(gen_args))}))",
                              timeout_s=seconds + 120)
        # drain: until every event written is counted, or 15 s
        wait_until(lambda: bool(sampler.counts) and sampler.counts[-1][2] >= written["events"],
                   timeout_s=15.0)
        drained = now_s()
        time.sleep(max(period_s or 0.0, 1.0) + 0.5)  # the targets of the last windows
        sampler.stop.set()
        sampler.join(10)
        rss = [_proc_hwm_mb(c.pid) for c, _ in children if c.pid and c.alive()]
        alive = all(c.alive() for c, _ in children)
    warm = start + min(max(seconds * 0.25, 3.0), seconds / 2)
    window = [s for s in sampler.cpu if warm <= s[0] <= drained]
    cpu_s = window[-1][1] - window[0][1] if len(window) > 1 else 0.0
    events = window[-1][2] - window[0][2] if len(window) > 1 else 0.0
    messages = window[-1][3] - window[0][3] if len(window) > 1 else 0.0
    span_s = window[-1][0] - window[0][0] if len(window) > 1 else 0.0
    idle = [s for s in sampler.cpu if s[0] <= start]
    idle_rate = ((idle[-1][1] - idle[0][1]) / (idle[-1][0] - idle[0][0])
                 if len(idle) > 1 and idle[-1][0] > idle[0][0] else 0.0)
    counted = sampler.counts[-1][2] if sampler.counts else 0.0
    shares = _cpu_shares([c for t, c in sampler.cpu_by_process if warm <= t <= drained])
    delays, missed = after_close_delays(
        written["closes_s"], shape.replicas, [(t, r) for t, r, _ in sampler.counts],
        sampler.targets, since_s=warm, until_s=start + seconds - (period_s or 10.0))
    in_rate = written["messages"] / max(written["seconds"], 1e-9)
    verdict = keeps_up([(t - start, y) for t, y in sampler.lag if t <= start + seconds + 1],
                       in_rate)
    raw = _child_json("import json, bench.fleet as f; print(json.dumps(f.raw_floor("
                      f"{bootstrap!r}, {prefix!r}, {written['events']})))", timeout_s=120)
    p99 = percentile(delays, 0.99)
    return {
        "keeps_up": bool(verdict["keeps_up"] and alive and counted >= written["events"]
                         and not missed),
        "targets_after_close_p99_s": None if p99 is None else round(p99, 3),
        "targets_after_close_p50_s": (None if not delays
                                      else round(percentile(delays, 0.5) or 0.0, 3)),
        "windows_without_targets": missed,
        "cpu_us_per_event": round(cpu_s / events * 1e6, 2) if events else None,
        "cpu_us_per_event_over_idle": (round(max(cpu_s - idle_rate * span_s, 0.0) / events
                                             * 1e6, 2) if events else None),
        "cpu_us_per_message": round(cpu_s / messages * 1e6, 2) if messages else None,
        "events_per_message": round(events / messages, 2) if messages else None,
        "idle_cpu_s_per_s": round(idle_rate, 3),
        "rss_mb_max": round(max(rss), 1) if rss else None,
        "raw_cpu_us_per_event": raw["cpu_us_per_event"],
        "ratio_to_raw": (round(cpu_s / events * 1e6 / raw["cpu_us_per_event"], 2)
                         if events and raw["cpu_us_per_event"] else None),
        "achieved_rps": written["achieved_rps"],
        "achieved_reports_per_s": written["achieved_reports_per_s"],
        "events_written": written["events"], "events_counted": round(counted),
        "messages_written": written["messages"],
        "events_per_s": round(written["events"] / max(written["seconds"], 1e-9)),
        "lag": {k: v for k, v in verdict.items() if k != "keeps_up"},
        "processes_alive": alive, "cpu_s": round(cpu_s, 2), "events_measured": round(events),
        "cpu_share_by_process": shares,
        "targets_published": sum(len(v) for v in sampler.targets.values()),
        "scopes_with_targets": len(sampler.targets),
        "generator_behind_max_s": written["behind_max_s"],
        "raw": raw, "sampler_errors": sampler.errors[:3],
    }


def _cpu_shares(samples: list[list[float]]) -> list[float] | None:
    """Each process's share of the group's CPU between the first and last sample: how evenly
    the work spread (one scope on one process with one stage; shared with two)."""
    if len(samples) < 2:
        return None
    used = [b - a for a, b in zip(samples[0], samples[-1], strict=True)]
    total = sum(used)
    return [round(u / total, 3) for u in used] if total > 0 else None


def run(replicas: int = 200, rps: float = 2000.0, sample: float = 0.1, processes: int = 2,
        seconds: float = 30.0, regions: int | None = None, partitions: int | None = None,
        clients: int | None = None, period_s: float | None = 1.0,
        bootstrap: str | None = None, stages: int = 1) -> dict[str, Any]:
    """`surplus bench fleet`: one synthetic fleet against `processes` control-plane processes.

    :param period_s: the control period the processes run with (None: the shipped one, 10 s);
        the default ticks once per report interval so that targets can follow each window.
    """
    regions = regions or max(4, 2 * processes)
    # Two stages spread each scope's reports over the partitions: give every process two.
    partitions = partitions or (max(regions, 2 * processes) if stages == 2 else regions)
    clients = clients or max(regions, replicas // 10)
    shape = Shape(replicas=replicas, rps=rps, sample=sample, regions=regions,
                  partitions=partitions, clients=clients, stages=stages)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="surplus-fleet-") as tmp:
        bootstrap = bootstrap or stack.enter_context(broker(Path(tmp)))
        result = measure(bootstrap, shape, processes, seconds, Path(tmp), period_s)
    asked = {"replicas": replicas, "rps": rps, "sample": sample, "processes": processes,
             "seconds": seconds, "regions": regions, "partitions": partitions,
             "clients": clients, "period_s": period_s, "stages": stages,
             "report_interval_s": shape.interval_s, "holdout": shape.holdout,
             "events_per_s_asked": round(shape.events_per_s())}
    short = result["achieved_rps"] < 0.95 * rps
    return {"bench": "fleet", **asked, **result, "rate_reached": not short,
            "target": "keeps up, targets within 2 s of close, <= 10 us/event and <= 2x raw",
            "meets_target": bool(result["keeps_up"] and not short
                                 and (result["targets_after_close_p99_s"] or 1e9) <= 2.0
                                 and (result["cpu_us_per_event"] or 1e9) <= 10.0
                                 and (result["ratio_to_raw"] or 1e9) <= 2.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument("--rps", type=float, default=2000.0)
    parser.add_argument("--sample", type=float, default=0.1)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--regions", type=int, default=None)
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--period-s", type=float, default=1.0)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--stages", type=int, choices=(1, 2), default=1)
    args = parser.parse_args()
    print(json.dumps(run(args.replicas, args.rps, args.sample, args.processes, args.seconds,
                         args.regions, args.partitions, args.clients, args.period_s,
                         args.bootstrap, args.stages)))


if __name__ == "__main__":
    main()
