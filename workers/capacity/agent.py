"""`surplus capacity-agent`: next to one replica, what it lends and when it is reclaimed, on Kafka.

Lending: beside an opportunistic replica the agent grants the replica's share of its pool on
the capacity topic (``lend.Lender``: a v7 ``CapacityEvent`` naming the replica, renewed inside
its lease while the worker beside it is ready), from what the platform says it holds
(``observe.PlatformReader`` reads, ``platform.share`` decides), and revokes it when the
replica is reclaimed or the agent exits.

Reclaims, from two sources, either or both:

- ``aws``: poll the EC2 metadata service (``imds.Imds``, IMDSv2) every ``poll_s`` for a spot
  interruption and a rebalance recommendation;
- ``k8s``: a termination hook. ``GET`` or ``POST /prestop`` on the hook port (the pod's preStop
  ``httpGet``) announces the pod's end within its grace period and answers once the notice is
  on Kafka, so the pod is not killed before the fleet knows. With this source SIGTERM to the
  agent (a sidecar in the pod) does the same, then the agent exits; with ``aws`` alone a
  SIGTERM only stops the agent (the machine is not going).

What to send is decided by ``decide.NoticeDecider`` and ``lend.Lender`` (pure); this module
only reads, logs and sends. A bad or missing document, an unreachable metadata service or a
broker that does not acknowledge is one log line (once per change, not per poll) and nothing
sent; the agent keeps polling, an unsent notice is sent again at the next poll and an unsent
grant or revoke is decided again.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import msgspec

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import encode
from schemas.contract import CapacityEvent, PreemptionNotice
from schemas.kafka_config import KafkaSettings
from workers.capacity.decide import (
    MetadataError,
    NoticeDecider,
    parse_instance_action,
    parse_rebalance,
)
from workers.capacity.imds import Imds, ImdsError
from workers.capacity.lend import Lender, WorkerProbe, serving
from workers.capacity.platform import Share
from workers.capacity.quiet import OncePerChange

log = logging.getLogger("surplus.capacity_agent")
T = TypeVar("T")

INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"


class EventSender:
    """Sends notices to the preemption topic and grants and revokes to the capacity topic,
    keyed by region, and waits for the broker; a failure is logged once per change."""

    def __init__(self, kafka: KafkaSettings, client_id: str) -> None:
        self.kafka = kafka
        self.producer = kafka_clients.notice_producer(kafka, **{"client.id": client_id})
        self._log = OncePerChange(lambda line: log.error("%s", line))

    def send(self, event: PreemptionNotice | CapacityEvent, timeout_s: float = 10.0) -> bool:
        """True once the broker acknowledged ``event``."""
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        topic = "preemption" if isinstance(event, PreemptionNotice) else "capacity"
        kafka_clients.produce_waiting(self.producer, self.kafka.topic(topic),
                                      key=event.region.encode(), value=encode(event),
                                      on_delivery=delivered)
        left = self.producer.flush(timeout_s)
        what = event.notice_id if isinstance(event, PreemptionNotice) else f"{event.kind}s"
        if left or failed:
            self._log.problem(topic, f"{topic} {what} not acknowledged by Kafka at "
                                     f"{self.kafka.bootstrap}: "
                                     f"{failed[0] if failed else 'timed out'}")
            return False
        self._log.fine(topic, f"{topic}: Kafka acknowledges again")
        return True

    def close(self) -> None:
        self.producer.flush(5.0)


def probe_worker(url: str, timeout_s: float = 2.0) -> WorkerProbe:
    """The worker's ``/readyz`` at ``url``: ready (200) or not, and the pool it reports."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/readyz", timeout=timeout_s) as resp:
            status, body = resp.status, resp.read(64 << 10)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(64 << 10)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return WorkerProbe(ready=False, detail=f"{url} unreachable: {reason}")
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {}
    pool = doc.get("pool_id") if isinstance(doc, dict) else None
    return WorkerProbe(ready=status == 200, pool_id=pool if isinstance(pool, str) else None,
                       detail=f"/readyz {status}")


class CapacityAgent:
    """Turns one replica's platform signals into grants and notices; ``run`` polls until
    ``stop``, ``close`` revokes what is still lent.

    ``share`` says what the replica lends now (None: nothing, the reason logged by it);
    ``probe`` asks the worker beside the agent whether it serves (None: no worker to ask).
    Without a ``lender`` the agent only reports reclaims.
    """

    def __init__(self, decider: NoticeDecider, send: Callable[[PreemptionNotice], bool], *,
                 imds: Imds | None = None, poll_s: float = 2.0, grace_s: float = 30.0,
                 clock: Callable[[], int] = wall_ms, lender: Lender | None = None,
                 share: Callable[[], Share | None] | None = None,
                 send_capacity: Callable[[CapacityEvent], bool] | None = None,
                 probe: Callable[[], WorkerProbe] | None = None) -> None:
        if lender is not None and (share is None or send_capacity is None):
            raise ValueError("a lender needs share and send_capacity")
        self.decider = decider
        self.send = send
        self.imds = imds
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.clock = clock
        self.lender = lender
        self.share = share
        self.send_capacity = send_capacity
        self.probe = probe
        self.stop = threading.Event()
        self.unsent: list[PreemptionNotice] = []
        self._lock = threading.Lock()
        self._log = OncePerChange(lambda line: log.warning("%s", line))
        self._said: tuple[str, str, float, float] | None = None

    # -- sources -----------------------------------------------------------------------------

    def poll_aws(self) -> list[PreemptionNotice]:
        """Read both documents once; returns the notices sent by this poll."""
        action = self._read(INSTANCE_ACTION, parse_instance_action)
        rebalance = self._read(REBALANCE, parse_rebalance)
        with self._lock:
            now = self.clock()
            notices = [self.decider.on_instance_action(action, now) if action else None]
            if rebalance is not None:
                notices.append(self.decider.on_rebalance(rebalance, now))
                if notices[-1] is None and self.decider.rebalances_seen == 1:
                    log.warning("rebalance recommendation for %s at %d: logged only "
                                "(--on-rebalance notice would reclaim the replica early)",
                                self.decider.replica.worker_id, rebalance.notice_ms)
            reclaimed = [n for n in notices if n is not None]
            self.unsent += reclaimed
        sent = self.flush()
        if reclaimed:
            self._reclaim()
        return sent

    def _read(self, path: str, parse: Callable[[bytes], T]) -> T | None:
        """The parsed document at ``path``; None when absent, or bad (logged once)."""
        assert self.imds is not None
        try:
            body = self.imds.get(path)
            signal = parse(body) if body is not None else None
        except (ImdsError, MetadataError) as exc:
            self._log.problem(path, f"no notice from {path} this poll: {exc}")
            return None
        self._log.fine(path, f"{path} reads again")
        return signal

    def terminate(self, why: str) -> PreemptionNotice | None:
        """The pod is going (preStop call or SIGTERM): announce it and send at once. Returns
        the notice that now stands for this replica (None only if none could be sent)."""
        with self._lock:
            notice = self.decider.on_termination(self.grace_s, self.clock(), why=why)
            if notice is not None:
                log.warning("%s: replica %s goes within %.0f s; notice %s", why,
                            self.decider.replica.worker_id, self.grace_s, notice.notice_id)
                self.unsent.append(notice)
        self.flush()
        self._reclaim()
        with self._lock:
            if self.unsent:
                return None
            return min(self.decider.sent, key=lambda n: n.deadline_ms, default=None)

    # -- lending -----------------------------------------------------------------------------

    def lend(self) -> list[CapacityEvent]:
        """One tick of lending: what the replica holds now and whether its worker serves,
        into a grant, a renewal, a revoke or nothing. Returns the events the broker took."""
        if self.lender is None or self.share is None:
            return []
        share = self.share()
        ok, why = True, None
        if share is not None:
            ok, why = serving(self.probe() if self.probe is not None else None, share.pool_id)
        if why is None:
            self._log.fine("worker", "the worker serves its pool again: lending")
        else:
            self._log.problem("worker", why)
        with self._lock:
            if share is not None:
                self._adopt(share)
            events = self.lender.tick(self.clock(), share, ok)
        return self._send_capacity(events)

    def close(self) -> list[CapacityEvent]:
        """The agent exits: revoke what the replica may still hold (three tries)."""
        if self.lender is None:
            return []
        taken: list[CapacityEvent] = []
        for _ in range(3):
            with self._lock:
                events = self.lender.stop(self.clock())
            if not events:
                break
            taken += self._send_capacity(events)
        return taken

    def _reclaim(self) -> None:
        """The replica is being reclaimed: its share is revoked now and never granted again."""
        if self.lender is None:
            return
        with self._lock:
            events = self.lender.reclaim(self.clock())
        self._send_capacity(events)

    def _adopt(self, share: Share) -> None:
        """Notices name the pool and units the replica lends (what a reclaim takes off)."""
        r = self.decider.replica
        if (r.pool_id, r.accelerator_units, r.cpu_units) != (
                share.pool_id, share.accelerator_units, share.cpu_units):
            self.decider.replica = msgspec.structs.replace(
                r, pool_id=share.pool_id, accelerator_units=share.accelerator_units,
                cpu_units=share.cpu_units)

    def _send_capacity(self, events: list[CapacityEvent]) -> list[CapacityEvent]:
        """Send in order, stopping at the first the broker does not take (the lender decides
        it again at the next tick)."""
        assert self.send_capacity is not None and self.lender is not None
        taken = []
        for event in events:
            if not self.send_capacity(event):
                break
            with self._lock:
                self.lender.sent(event)
            taken.append(event)
            said = (event.kind, event.pool_id, event.accelerator_units, event.cpu_units)
            if said != self._said:  # a renewal of the same share is not news
                self._said = said
                if event.kind == "grant":
                    log.warning("granted %s's share of pool %s: %g %s units, %g CPU units, "
                                "renewed while it serves", event.replica, event.pool_id,
                                event.accelerator_units, event.accelerator, event.cpu_units)
                else:
                    log.warning("revoked %s's share of pool %s", event.replica, event.pool_id)
        return taken

    def flush(self) -> list[PreemptionNotice]:
        """Send what is waiting, in order; what the broker did not take waits for the next
        poll (a notice is never dropped)."""
        sent: list[PreemptionNotice] = []
        with self._lock:
            while self.unsent:
                notice = self.unsent[0]
                if not self.send(notice):
                    break
                self.unsent.pop(0)
                sent.append(notice)
                log.warning("sent notice %s: replica %s of pool %s reclaimed by %d "
                            "(in %.1f s)", notice.notice_id, notice.replicas[0],
                            notice.pool_id, notice.deadline_ms,
                            (notice.deadline_ms - notice.ts_ms) / 1000)
        return sent

    def run(self) -> None:
        """Poll until ``stop`` is set (SIGTERM's handler sets it after its notice)."""
        while not self.stop.is_set():
            if self.imds is not None:
                self.poll_aws()
            else:
                self.flush()
            self.lend()
            self.stop.wait(self.poll_s)


def serve_hook(agent: CapacityAgent, host: str, port: int) -> ThreadingHTTPServer:
    """The termination hook on ``host:port`` from a daemon thread: ``/prestop`` answers 200
    with the notice once it is on Kafka (503 if it could not be sent), ``/healthz`` 200."""

    class Hook(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/prestop":
                notice = agent.terminate("prestop")
                status = 200 if notice is not None else 503
                body = encode(notice) if notice is not None else b'{"error": "not sent"}'
            elif path == "/healthz":
                status, body = 200, b'{"status": "ok"}'
            else:
                status, body = 404, b'{"error": "unknown path; try /prestop or /healthz"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer((host, port), Hook)
    threading.Thread(target=server.serve_forever, name="capacity-agent-hook",
                     daemon=True).start()
    return server
