"""`bench.fleet`'s generator: what a synthetic fleet writes into a real broker, in a process
of its own. One WindowReport per replica per report interval (spread over the interval, as
live workers send them), the decision records its clients log at the sample rate (the holdout
always) in batches per client and linger, and one label per logged decision a little later on
its scope's partition. Messages are pre-encoded from templates and produced in batches; the
result says how many it wrote and at what rate, so a generator that falls short says so.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

from bench.fleet_verdicts import region_names
from schemas.clock import wall_ms_fine
from schemas.topics import scope_partition

REPORT_INTERVAL_S = 1.0
STEP_S = 0.05
LINGER_S = 0.2
BATCH_MAX = 500
LABEL_DELAY_S = 1.0
HOLDOUT = 0.01
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
    stages: int = 1
    """2: reports are keyed by replica (``telemetry_key = "replica"``), as for a control
    plane run with ``--stages 2``; 1: by scope."""
    label_delay_s: float = LABEL_DELAY_S

    @property
    def logged_share(self) -> float:
        """Share of requests whose decision is logged: the holdout, and `sample` of the rest."""
        return self.holdout + (1.0 - self.holdout) * self.sample

    def events_per_s(self) -> float:
        """Reports, decision records and labels a second, at the asked rate."""
        return self.replicas / self.interval_s + 2 * self.rps * self.logged_share



def now_s() -> float:
    """Wall-clock seconds (`schemas.clock`: the time base the control plane stamps with)."""
    return wall_ms_fine() / 1000.0



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
    report_keys = [(f"w{i}" if shape.stages == 2 else regions[i % len(regions)]).encode()
                   for i in range(shape.replicas)]
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

    while now_s() < start_wall_s:
        time.sleep(0.005)
    t0 = start_wall_s
    end = t0 + seconds
    next_client = 0.0  # clients flushed so far, fractional
    step = 0
    while True:
        step += 1
        target_t = min(t0 + step * STEP_S, end)
        now = now_s()
        if now < target_t:
            time.sleep(target_t - now)
        now = now_s()
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
            produce(t_topic, report_keys[i], value)
            if i == shape.replicas - 1:
                closes.append(now_s())
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
    took = max(now_s() - t0, 1e-9)
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


