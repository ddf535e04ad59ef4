"""A slow and broken network between Kafka and everything that talks to it, under load.

toxiproxy stands between the broker and the control plane, the workers and the ranking client:
the test's own broker advertises the proxy's port, so every client, once bootstrapped, is sent
back through the proxy and every byte they exchange with Kafka crosses it. The network then
turns slow (200 ms each way with 50 ms of jitter; a thin link), starved (a link thinner than
the control plane's input), a black hole (nothing passes, connections die after 3 s) and cut
(connections refused), one at a time while ranking load arrives, and heals after each.

What must hold: baseline never depends on Kafka, so it is served within the SLA through every
fault; a slow network delays targets but they arrive well within their TTL and optional work
goes on; when targets stop arriving (starved or cut) the targets held lapse at their TTL and
the worker and the client fail safe to baseline only (invariant 2), neither early nor late; and
once the network heals fresh targets arrive and optional work resumes. The worker's
`surplus_worker_targets_age_seconds` is sampled throughout; every time is printed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from schemas import kafka_clients
from schemas.kafka_config import KafkaSettings
from streams.control.config import RmaConfig
from surplus import localkafka
from surplus.topics import apply_topics
from tests.faults.conftest import Figures
from tests.faults.fleet import Fleet, figures_of
from tests.faults.load import LoadRunner, Window
from tests.faults.toxiproxy import Toxiproxy
from tests.integration.fleet import by_label, metric

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]

PROXY = "kafka"
#: One broker, a few hundred messages a second: a small heap leaves the 2-core box its memory.
BROKER_HEAP_MB = 256
SLA_P99_MS = RmaConfig().sla_p99_ms
TTL_S = 6.0
SLOW_S = 10.0
#: Longer than the TTL, so the held targets lapse and the fail-safe shows for a few seconds.
BROKEN_S = 11.0
LATENCY_MS, JITTER_MS = 200, 50
#: Per connection and direction: above what any client sends or fetches at 40 requests/s.
THIN_KB_S = 32
#: Below what the control plane fetches (40 routing outcomes a second, telemetry, its ticks).
STARVED_KB_S = 2
#: Targets this old or younger are fresh: one 1 s period, the worker's fetch and slack for a
#: loaded machine (the TTL is 6 s).
FRESH_S = 2.5
SAMPLE_EVERY_S = 0.2
#: Sampling and scraping delay the moment a fail-safe is seen by up to this much.
SEEN_WITHIN_S = 1.5


@dataclass
class Network:
    """The test's broker behind its proxy: clients use `kafka`; `direct` is the broker's own
    listener, for checks behind the proxy."""

    kafka: KafkaSettings
    proxy: Toxiproxy
    proxy_port: int
    direct: str


@pytest.fixture
def behind_toxiproxy(tmp_path: Path) -> Iterator[Network]:
    """toxiproxy on a free port, a broker of the test's own whose client listener advertises
    the proxy, and the catalog applied through the proxy; both stopped whatever happens."""
    localkafka.fetch_jars()
    proxy = Toxiproxy(tmp_path).start()
    data_dir = tmp_path / "kafka"
    try:
        port, proxy_port = localkafka.free_port_block(2), localkafka.free_port()
        behind = localkafka.BehindProxy(proxy_port=proxy_port, direct_port=localkafka.free_port())
        proxy.proxy(PROXY, proxy_port, port)
        localkafka.up(port=port, data_dir=data_dir, heap_mb=BROKER_HEAP_MB, behind_proxy=behind)
        kafka = KafkaSettings(bootstrap=f"127.0.0.1:{proxy_port}",
                              prefix=f"n{uuid.uuid4().hex[:6]}.")
        assert apply_topics(kafka.confluent(), kafka.prefix, partitions_override=2).ok
        yield Network(kafka, proxy, proxy_port, f"127.0.0.1:{behind.direct_port}")
    finally:
        localkafka.down(data_dir)
        proxy.stop()


@dataclass(frozen=True)
class TargetsSample:
    """What the worker said about its targets at load time `t`."""

    t: float
    age_s: float
    baseline_only: bool
    epoch: float


@dataclass
class TargetsWatch:
    """Samples a worker's /metrics every `SAMPLE_EVERY_S` on a thread of its own, so the age
    of its targets is known at every moment of every fault."""

    fleet: Fleet
    worker: str = "b1"
    samples: list[TargetsSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TargetsWatch:
        self._thread = threading.Thread(target=self._run, name="targets-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        load = self.fleet.runner
        while not self._stop.wait(SAMPLE_EVERY_S):
            try:
                m = self.fleet.workers[self.worker].metrics()
            except OSError:
                continue
            self.samples.append(TargetsSample(
                t=load.now(), age_s=metric(m, "surplus_worker_targets_age_seconds"),
                baseline_only=metric(m, "surplus_worker_targets_baseline_only") == 1,
                epoch=metric(m, "surplus_worker_targets_epoch")))

    def between(self, t0: float, t1: float) -> list[TargetsSample]:
        return [s for s in list(self.samples) if t0 <= s.t < t1]

    def latest(self) -> TargetsSample:
        assert self.samples, "no /metrics sample of the worker yet"
        return self.samples[-1]

    @staticmethod
    def is_fresh(s: TargetsSample, epoch_above: float = -1.0) -> bool:
        """Fresh targets newer than `epoch_above` in force (not baseline only)."""
        return not s.baseline_only and 0 <= s.age_s <= FRESH_S and s.epoch > epoch_above

    def fresh(self, since: float, epoch_above: float = -1.0) -> bool:
        """The latest sample is after `since` and shows fresh targets newer than
        `epoch_above`."""
        s = self.latest()
        return s.t > since and self.is_fresh(s, epoch_above)

    def first_baseline_only(self, t0: float, t1: float) -> float | None:
        """Seconds from `t0` to the first sample in [t0, t1) that says baseline only."""
        return next((round(s.t - t0, 2) for s in self.between(t0, t1) if s.baseline_only),
                    None)

    def held_baseline_only(self, t0: float, t1: float) -> bool:
        """Once baseline only in [t0, t1), every later sample up to `t1` says so too."""
        samples = self.between(t0, t1)
        first = next((i for i, s in enumerate(samples) if s.baseline_only), len(samples))
        return all(s.baseline_only for s in samples[first:])


@dataclass(frozen=True)
class Phase:
    """One fault under load and its healing: load times, the targets' ages on the worker, and
    seconds from the fault (fail-safe) or from healing (fresh targets, optional work)."""

    name: str
    at: float
    healed: float
    window: Window
    age_at_start_s: float
    #: The least age of a target issued after the fault began (None: none arrived before it
    #: healed).
    min_age_s: float | None
    max_age_s: float
    worker_fail_safe_s: float | None
    client_fail_safe_s: float | None
    #: Once the worker was baseline only it stayed so until the network healed.
    fail_safe_held: bool
    fresh_s: float
    rma_resumed_s: float
    sbm_resumed_s: float
    broker_served_behind_proxy: bool

    def figures(self) -> dict[str, object]:
        return figures_of(self.window) | {
            "targets age s (at start, min, max)": [self.age_at_start_s, self.min_age_s,
                                                   self.max_age_s],
            "baseline only after s (worker, client)": [self.worker_fail_safe_s,
                                                       self.client_fail_safe_s],
            "after healing s (fresh targets, RMA extras, SBM requests)": [
                self.fresh_s, self.rma_resumed_s, self.sbm_resumed_s],
            "broker served behind the proxy": self.broker_served_behind_proxy}


def _client_fail_safe(load: LoadRunner, t0: float, t1: float) -> float | None:
    """Seconds from `t0` to the start of the stretch that ends at `t1` in which the client sent
    every request baseline only (no extra candidates, none routed to the powerful pool); None
    unless it lasts a second (one request may go without extras for other reasons)."""
    samples = sorted((s for s in load.samples if t0 <= s.t < t1), key=lambda s: s.t)
    start = None
    for s in samples:
        if s.extra == 0 and s.routed == "baseline":
            start = s.t if start is None else start
        else:
            start = None
    return None if start is None or t1 - start < 1.0 else round(start - t0, 2)


def _fault(net: Network, fleet: Fleet, watch: TargetsWatch, name: str, seconds: float,
           break_it: Callable[[], None]) -> Phase:
    """From fresh targets, break the network with `break_it()` for `seconds` under load, heal
    it, and wait for fresh targets and optional work again; what the worker and the load saw."""
    load = fleet.runner
    since = load.now()
    fleet.wait_for(f"fresh targets before {name}", lambda: watch.fresh(since), 60)
    age_at_start, epoch_at_start = watch.latest().age_s, watch.latest().epoch
    at = load.now()
    break_it()
    time.sleep(seconds / 2)
    served = localkafka.serves_metadata(net.direct)
    time.sleep(seconds / 2)
    fleet.assert_alive()
    epoch = fleet.worker_metric("b1", "surplus_worker_targets_epoch")
    net.proxy.clear(PROXY)
    healed = load.now()

    def first_after(model: str) -> float | None:
        """Seconds from healing to the first request with optional work done by `model`'s
        pool: extra candidates on the ranking pool, or served by the powerful one."""
        fleet.assert_alive()
        return next((s.t - healed for s in list(load.samples) if s.t >= healed and s.model
                     == model and (model == "powerful" or s.optional_scored > 0)), None)

    fleet.wait_for(f"fresh targets after {name}",
                   lambda: watch.fresh(healed, epoch_above=epoch), 60)
    fleet.wait_for(f"optional work after {name}",
                   lambda: first_after("baseline") is not None
                   and first_after("powerful") is not None, 60)
    fresh_s = next(s.t - healed for s in watch.between(healed, load.now())
                   if watch.is_fresh(s, epoch_above=epoch))
    resumed = (first_after("baseline") or 0.0, first_after("powerful") or 0.0)
    ages = [s.age_s for s in watch.between(at, healed)]
    # The next target may already be on its way when the fault begins (a tick a second), so it
    # crosses the fault once, not twice: the least age counts the targets issued after it.
    issued_after = [s.age_s for s in watch.between(at, healed) if s.epoch > epoch_at_start + 1]
    return Phase(name, at, healed, load.window(at, healed), round(age_at_start, 2),
                 round(min(issued_after), 2) if issued_after else None, round(max(ages), 2),
                 watch.first_baseline_only(at, healed), _client_fail_safe(load, at, healed),
                 watch.held_baseline_only(at, healed), round(fresh_s, 1), round(resumed[0], 1),
                 round(resumed[1], 1), served)


def _assert_slow(phase: Phase, fleet: Fleet) -> None:
    """Slow targets stay fresh: no fail-safe anywhere, optional work goes on throughout."""
    assert phase.worker_fail_safe_s is None, phase
    assert phase.max_age_s < TTL_S - 1.0, phase
    late = fleet.runner.window(phase.at + SLOW_S / 2, phase.healed)
    assert late.optional_done > 0 and late.served_powerful > 0, late.line(phase.name)


def _assert_fails_safe(phase: Phase, fleet: Fleet, cut: bool) -> None:
    """Targets stop arriving: worker and client go baseline only within the TTL (after a cut,
    not before the targets held at its start lapse, and for good), no optional work is done
    once both have, and everything is back after healing."""
    assert phase.worker_fail_safe_s is not None and phase.client_fail_safe_s is not None, phase
    assert phase.worker_fail_safe_s <= TTL_S + SEEN_WITHIN_S, phase
    assert phase.client_fail_safe_s <= TTL_S + SEEN_WITHIN_S, phase
    if cut:  # nothing arrives after a cut: the held targets live out their TTL, no less
        not_before = TTL_S - phase.age_at_start_s - SEEN_WITHIN_S
        assert phase.worker_fail_safe_s >= not_before, phase
        assert phase.client_fail_safe_s >= not_before, phase
        assert phase.broker_served_behind_proxy, "a network cut, not a broker outage"
        assert phase.fail_safe_held, "stale targets must not bring optional work back"
    both = max(phase.worker_fail_safe_s, phase.client_fail_safe_s)
    lapsed = fleet.runner.window(phase.at + both + 0.5, phase.healed)
    assert lapsed.served > 0 and lapsed.optional_done == 0 and lapsed.routed_powerful == 0, \
        lapsed.line(phase.name)
    assert max(phase.fresh_s, phase.rma_resumed_s, phase.sbm_resumed_s) < 30, phase


def test_slow_starved_and_cut_network_to_kafka_keeps_baseline_fails_safe_and_recovers(
        behind_toxiproxy: Network, tmp_path: Path, figures: Figures,
        stopping: list[Fleet]) -> None:
    net = behind_toxiproxy
    toxics = net.proxy
    brokers = kafka_clients.admin(net.kafka).list_topics(timeout=10).brokers
    assert {b.port for b in brokers.values()} == {net.proxy_port}, \
        "clients must be told the proxy's port, or they would go round it"
    fleet = Fleet(tmp_path, net.kafka, baseline=1, powerful=1, ttl_s=TTL_S)
    stopping.append(fleet)
    fleet.start()
    load = fleet.runner
    warm = fleet.warm_up(timeout_s=90)
    watch = TargetsWatch(fleet).start()
    try:
        time.sleep(3)
        clean = [s.age_s for s in watch.between(warm, load.now())]
        outages_before = fleet.worker_metric("b1", "surplus_worker_kafka_outages_total")
        latency = _fault(net, fleet, watch, "latency", SLOW_S, lambda: toxics.add_both_ways(
            PROXY, "latency", latency=LATENCY_MS, jitter=JITTER_MS))
        thin = _fault(net, fleet, watch, "thin", SLOW_S, lambda: toxics.add_both_ways(
            PROXY, "bandwidth", rate=THIN_KB_S))
        starved = _fault(net, fleet, watch, "starved", BROKEN_S, lambda: toxics.add_both_ways(
            PROXY, "bandwidth", rate=STARVED_KB_S))
        black_hole = _fault(net, fleet, watch, "black hole", BROKEN_S,
                            lambda: toxics.add_both_ways(PROXY, "timeout", timeout=3000))
        refused = _fault(net, fleet, watch, "cut", BROKEN_S,
                         lambda: toxics.set_enabled(PROXY, False))
        time.sleep(3)
        fleet.assert_alive()
        after = load.window(refused.healed + refused.sbm_resumed_s)
        b1 = fleet.workers["b1"].metrics()
        summary = load.client_summary()
    finally:
        watch.stop()
    fleet.stop()
    whole = load.window(0.0)

    figures.add("network", f"toxiproxy between Kafka and every client (advertised "
                           f"127.0.0.1:{net.proxy_port}); targets period 1 s, TTL {TTL_S:.0f} s")
    figures.add("clean targets age s (min, max)", [round(min(clean), 2), round(max(clean), 2)])
    for label, phase in ((f"latency {LATENCY_MS}±{JITTER_MS} ms each way", latency),
                         (f"thin link {THIN_KB_S} KB/s each way", thin),
                         (f"starved link {STARVED_KB_S} KB/s each way", starved),
                         ("black hole (timeout toxic: connections closed after 3 s)",
                          black_hole),
                         ("cut (proxy disabled: connections refused)", refused)):
        figures.add(label, phase.figures())
    figures.add("after", figures_of(after))
    figures.add("worker b1 kafka outages seen",
                metric(b1, "surplus_worker_kafka_outages_total") - outages_before)
    figures.add("worker b1 target verdicts",
                by_label(b1, "surplus_worker_target_verdicts_total", "verdict"))
    figures.add("client decisions", summary["decisions"])

    # Baseline never depends on Kafka: nothing lost, p99 within the SLA through every fault.
    assert whole.lost == {} and whole.served == whole.sent, whole.lost
    for phase in (latency, thin, starved, black_hole, refused):
        assert phase.window.baseline_p99_ms <= SLA_P99_MS, phase.window.line(phase.name)
    # A slow network delays the targets (each crosses the proxy twice: to the broker and to
    # the worker), but they stay fresh and optional work goes on.
    assert latency.min_age_s is not None, latency
    assert latency.min_age_s >= 2 * (LATENCY_MS - JITTER_MS) / 1000 - 0.05, latency
    _assert_slow(latency, fleet)
    _assert_slow(thin, fleet)
    # Targets stop arriving: they lapse at their TTL, baseline only, then everything is back.
    _assert_fails_safe(starved, fleet, cut=False)
    _assert_fails_safe(black_hole, fleet, cut=True)
    _assert_fails_safe(refused, fleet, cut=True)
    assert metric(b1, "surplus_worker_kafka_outages_total") > outages_before, \
        "the worker never lost Kafka: its traffic did not cross the proxy"
    assert after.optional_done > 0 and after.served_powerful > 0, after.line("after")
