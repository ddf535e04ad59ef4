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
``regions`` scopes, named so that each lands on its own partition (a scope is one partition and
one process today: more processes only spread whole scopes).

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
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import broker
from schemas.clock import wall_ms_fine
from schemas.topics import scope_partition

REPORT_INTERVAL_S = 1.0
STEP_S = 0.05
LINGER_S = 0.2
BATCH_MAX = 500
LABEL_DELAY_S = 1.0
HOLDOUT = 0.01
IDLE_S = 4.0
WINDOW_START, WINDOW_END = b"1111111111111", b"2222222222222"
TS, RID, VALUE = b"3333333333333", b"RIDRIDRIDRIDRIDRID", b"0.123456"


@dataclass(frozen=True)
class Shape:
    """What the synthetic fleet writes."""

    replicas: int
    rps: float
    sample: float
    regions: int
    partitions: int
    clients: int
    interval_s: float = REPORT_INTERVAL_S
    holdout: float = HOLDOUT
    label_delay_s: float = LABEL_DELAY_S

    @property
    def logged_share(self) -> float:
        """Share of requests whose decision is logged: the holdout, and `sample` of the rest."""
        return self.holdout + (1.0 - self.holdout) * self.sample

    def events_per_s(self) -> float:
        """Reports, decision records and labels a second, at the asked rate."""
        return self.replicas / self.interval_s + 2 * self.rps * self.logged_share


def _now() -> float:
    """Wall-clock seconds (`schemas.clock`: the time base the control plane stamps with)."""
    return wall_ms_fine() / 1000.0


# ---- pure parts: percentiles, lag trend, delays -------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q` quantile (0..1) by linear interpolation between order statistics; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * min(max(q, 0.0), 1.0)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y); 0 for fewer than two distinct times."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in points) / var


def keeps_up(lag: Sequence[tuple[float, float]], in_rate: float,
             bound_s: float = 5.0, growth: float = 0.05) -> dict[str, Any]:
    """Whether a consumer keeps up, from (t_s, lag_messages) samples over a run.

    It keeps up when, over the second half of the samples, the lag's fitted slope is at most
    `growth` of the input rate (it takes at least 95% of what comes in: anything less grows
    without bound) and the last lag is under `bound_s` seconds of input (commits are a second
    apart, so a consumer that keeps up shows about a second of lag).
    """
    if len(lag) < 4:
        return {"keeps_up": False, "why": "too few lag samples"}
    half = lag[len(lag) // 2:]
    trend = slope(half)
    last = half[-1][1]
    bound = max(bound_s * in_rate, 100.0)
    ok = trend <= growth * max(in_rate, 1.0) and last <= bound
    return {"keeps_up": ok, "lag_slope_per_s": round(trend, 1), "lag_last": last,
            "lag_max": max(y for _, y in lag), "lag_bound": round(bound)}


def consumed_at(counts: Sequence[tuple[float, float]], needed: float) -> float | None:
    """The first time (from (t, cumulative count) samples, in order) the count reached
    `needed`; None if it never did."""
    for t, count in counts:
        if count >= needed:
            return t
    return None


def after_close_delays(closes_s: Sequence[float], per_window: int,
                       counts: Sequence[tuple[float, float]],
                       targets: Mapping[str, Sequence[float]], since_s: float,
                       until_s: float) -> tuple[list[float], int]:
    """Per scope and fleet window closed in [since_s, until_s): seconds from the close to the
    scope's first targets published once the control plane had counted all of the window's
    reports (``(w + 1) * per_window`` in all). Windows it never counted, or with no targets
    after, are returned as a count instead (they missed)."""
    delays: list[float] = []
    missed = 0
    for w, close in enumerate(closes_s):
        if not since_s <= close < until_s:
            continue
        seen = consumed_at(counts, (w + 1) * per_window)
        for times in targets.values():
            after = next((t for t in times if seen is not None and t >= seen), None)
            if after is None:
                missed += 1
            else:
                delays.append(max(after - close, 0.0))
    return delays, missed


def region_names(regions: int, partitions: int) -> list[str]:
    """`regions` scope names, each on a partition of its own while there are partitions to
    spare (a scope's events all go to one partition, by murmur2 of its name)."""
    names: list[str] = []
    used: set[int] = set()
    candidate = 0
    while len(names) < regions:
        name = f"r{candidate}"
        candidate += 1
        p = scope_partition(name, partitions)
        if p in used and len(used) < partitions and candidate < 100_000:
            continue
        used.add(p)
        names.append(name)
    return names


# ---- the generator (its own process) ------------------------------------------------------


def _templates(shape: Shape, regions: list[str]) -> tuple[list[bytes], dict[tuple[str, bool],
                                                                           bytes]]:
    from msgspec import UNSET

    from schemas.codec import encode
    from schemas.contract import SAMPLED_VERSION, SUPPLY_VERSION, RoutingOutcome, WindowReport
    from schemas.sketch import new_sketch, to_wire

    per_replica = shape.rps / shape.replicas * shape.interval_s
    sketch = new_sketch()
    for i in range(200):
        sketch.add(4.0 + (i % 50) * 0.8)
    wire = to_wire(sketch)
    reports = []
    for i in range(shape.replicas):
        region = regions[i % len(regions)]
        reports.append(encode(WindowReport(
            pool_id=f"{region}/rank/baseline/a100/baseline", worker_id=f"w{i}", region=region,
            service="rank", model="baseline", tier="baseline", accelerator="a100",
            window_start_ms=int(WINDOW_START), window_end_ms=int(WINDOW_END),
            requests=round(per_replica), baseline_requests=round(per_replica),
            latency_ms=wire, utilisation=0.5, capacity_rps=2 * per_replica / shape.interval_s,
            busy_s=0.5 * shape.interval_s, units_done=round(per_replica) * 100)))
    decisions = {}
    for region in regions:
        for holdout in (False, True):
            sampled = not holdout and shape.sample < 1.0
            record = RoutingOutcome(
                v=SAMPLED_VERSION if sampled else SUPPLY_VERSION, ts_ms=int(TS), scope=region,
                request_id=RID.decode(), segment="s1", model="baseline", extra=0 if holdout
                else 8, propensity=1.0, holdout=holdout, available=200,
                inclusion=shape.sample if sampled else UNSET)
            decisions[(region, holdout)] = encode(record)
    return reports, decisions


def generate(bootstrap: str, prefix: str, shape: Shape, seconds: float,
             start_wall_s: float) -> dict[str, Any]:
    """Write the fleet's events from `start_wall_s` for `seconds`; what was written."""
    from schemas import kafka_clients
    from schemas.codec import encode
    from schemas.contract import OutcomeLabel
    from schemas.kafka_config import KafkaSettings

    kafka = KafkaSettings(bootstrap=bootstrap, prefix=prefix)
    regions = region_names(shape.regions, shape.partitions)
    reports, decisions = _templates(shape, regions)
    label_tpl = {r: encode(OutcomeLabel(ts_ms=int(TS), scope=r, request_id=RID.decode(),
                                        value=float(VALUE))) for r in regions}
    label_partition = {r: scope_partition(r, shape.partitions) for r in regions}
    producer = kafka_clients.producer(kafka, **{
        "linger.ms": 20, "batch.num.messages": 10_000, "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 2_000_000})
    t_topic, o_topic, l_topic = (kafka.topic(t) for t in ("telemetry", "outcomes", "labels"))
    clients = max(1, shape.clients)
    client_region = [regions[c % len(regions)] for c in range(clients)]
    pending: list[list[bytes]] = [[] for _ in range(clients)]
    pending_labels: list[list[tuple[bytes, bytes]]] = [[] for _ in range(clients)]
    label_queue: deque[tuple[float, int, bytes]] = deque()
    holdout_share = shape.holdout / shape.logged_share
    run_id = uuid.uuid4().hex[:6]
    reports_done = logged_done = labels_done = messages = 0
    closes: list[float] = []
    behind_max = 0.0

    def produce(topic: str, key: bytes, value: bytes, partition: int = -1) -> None:
        nonlocal messages
        while True:
            try:
                if partition >= 0:
                    producer.produce(topic, key=key, value=value, partition=partition)
                else:
                    producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.01)
        messages += 1

    def flush_client(c: int) -> None:
        region = client_region[c]
        key = region.encode()
        batch = pending[c]
        for i in range(0, len(batch), BATCH_MAX):
            chunk = batch[i:i + BATCH_MAX]
            produce(o_topic, key, chunk[0] if len(chunk) == 1 else b"[" + b",".join(chunk) + b"]")
        pending[c] = []
        labels = pending_labels[c]
        for i in range(0, len(labels), BATCH_MAX):
            pairs = labels[i:i + BATCH_MAX]
            if len(pairs) == 1:
                produce(l_topic, pairs[0][0], pairs[0][1], label_partition[region])
            else:
                produce(l_topic, key, b"[" + b",".join(v for _, v in pairs) + b"]",
                        label_partition[region])
        pending_labels[c] = []

    while _now() < start_wall_s:
        time.sleep(0.005)
    t0 = start_wall_s
    end = t0 + seconds
    next_client = 0.0  # clients flushed so far, fractional
    step = 0
    while True:
        step += 1
        target_t = min(t0 + step * STEP_S, end)
        now = _now()
        if now < target_t:
            time.sleep(target_t - now)
        now = _now()
        behind_max = max(behind_max, now - target_t)
        elapsed = target_t - t0
        now_ms = int(now * 1000)
        # telemetry: report j is due at t0 + j * interval / replicas
        due = int(elapsed / shape.interval_s * shape.replicas)
        for j in range(reports_done, due):
            i = j % shape.replicas
            end_ms = b"%d" % int((t0 + (j + 1) * shape.interval_s / shape.replicas) * 1000)
            start_ms = b"%d" % (int(end_ms) - int(shape.interval_s * 1000))
            value = reports[i].replace(WINDOW_START, start_ms).replace(WINDOW_END, end_ms)
            produce(t_topic, regions[i % len(regions)].encode(), value)
            if i == shape.replicas - 1:
                closes.append(_now())
        reports_done = max(reports_done, due)
        # decision records: the logged requests due so far, dealt over the clients
        logged_due = int(elapsed * shape.rps * shape.logged_share)
        ts = b"%d" % now_ms
        for m in range(logged_done, logged_due):
            c = m % clients
            holdout = math.floor((m + 1) * holdout_share) > math.floor(m * holdout_share)
            rid = b"q%s-%x" % (run_id.encode(), m)
            tpl = decisions[(client_region[c], holdout)]
            pending[c].append(tpl.replace(TS, ts).replace(RID, rid))
            label_queue.append((target_t + shape.label_delay_s, c, rid))
        logged_done = max(logged_done, logged_due)
        # labels that are due join their client's next batch
        while label_queue and label_queue[0][0] <= target_t:
            _, c, rid = label_queue.popleft()
            pending_labels[c].append((rid, label_tpl[client_region[c]].replace(TS, ts).replace(
                RID, rid).replace(VALUE, b"%.2f" % (0.5 + (labels_done % 100) / 100))))
            labels_done += 1
        # each client flushes once per linger, the clients staggered over it
        flushes = elapsed / LINGER_S * clients
        while next_client + 1 <= flushes:
            flush_client(int(next_client) % clients)
            next_client += 1
        producer.poll(0)
        if target_t >= end:
            break
    for c in range(clients):
        flush_client(c)
    left = producer.flush(60)
    took = max(_now() - t0, 1e-9)
    requests = logged_done / shape.logged_share
    return {
        "reports": reports_done, "decisions": logged_done, "labels": labels_done,
        "events": reports_done + logged_done + labels_done, "messages": messages,
        "undelivered": left, "closes_s": closes, "seconds": round(took, 2),
        "achieved_rps": round(requests / took), "achieved_reports_per_s": round(
            reports_done / took), "behind_max_s": round(behind_max, 3)}


def _generator_main(args: dict[str, Any]) -> None:
    shape = Shape(**args.pop("shape"))
    print(json.dumps(generate(shape=shape, **args)))


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
            now_ms = int(_now() * 1000)
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
            now = _now()
            try:
                scraped = [_scrape(port) for _, port in self.procs]
                cpu = sum(_proc_cpu_s(pid) for pid, _ in self.procs)
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
        start = _now() + IDLE_S  # the processes' idle cost is measured before it
        gen_args = {"bootstrap": bootstrap, "prefix": prefix, "shape": asdict(shape),
                    "seconds": seconds, "start_wall_s": start}
        written = _child_json("import json, bench.fleet as f; "
                              f"f._generator_main(json.loads({json.dumps(json.dumps(gen_args))}))",
                              timeout_s=seconds + 120)
        # drain: until every event written is counted, or 15 s
        wait_until(lambda: bool(sampler.counts) and sampler.counts[-1][2] >= written["events"],
                   timeout_s=15.0)
        drained = _now()
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
        "targets_published": sum(len(v) for v in sampler.targets.values()),
        "scopes_with_targets": len(sampler.targets),
        "generator_behind_max_s": written["behind_max_s"],
        "raw": raw, "sampler_errors": sampler.errors[:3],
    }


def run(replicas: int = 200, rps: float = 2000.0, sample: float = 0.1, processes: int = 2,
        seconds: float = 30.0, regions: int | None = None, partitions: int | None = None,
        clients: int | None = None, period_s: float | None = 1.0,
        bootstrap: str | None = None) -> dict[str, Any]:
    """`surplus bench fleet`: one synthetic fleet against `processes` control-plane processes.

    :param period_s: the control period the processes run with (None: the shipped one, 10 s);
        the default ticks once per report interval so that targets can follow each window.
    """
    regions = regions or max(4, 2 * processes)
    partitions = partitions or regions
    clients = clients or max(regions, replicas // 10)
    shape = Shape(replicas=replicas, rps=rps, sample=sample, regions=regions,
                  partitions=partitions, clients=clients)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="surplus-fleet-") as tmp:
        bootstrap = bootstrap or stack.enter_context(broker(Path(tmp)))
        result = measure(bootstrap, shape, processes, seconds, Path(tmp), period_s)
    asked = {"replicas": replicas, "rps": rps, "sample": sample, "processes": processes,
             "seconds": seconds, "regions": regions, "partitions": partitions,
             "clients": clients, "period_s": period_s,
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
    args = parser.parse_args()
    print(json.dumps(run(args.replicas, args.rps, args.sample, args.processes, args.seconds,
                         args.regions, args.partitions, args.clients, args.period_s,
                         args.bootstrap)))


if __name__ == "__main__":
    main()
