"""`surplus capacity-agent`: next to one replica, the platform's reclaims become notices on Kafka.

Two sources, either or both:

- ``aws``: poll the EC2 metadata service (``imds.Imds``, IMDSv2) every ``poll_s`` for a spot
  interruption and a rebalance recommendation;
- ``k8s``: a termination hook. ``GET`` or ``POST /prestop`` on the hook port (the pod's preStop
  ``httpGet``) announces the pod's end within its grace period and answers once the notice is
  on Kafka, so the pod is not killed before the fleet knows. With this source SIGTERM to the
  agent (a sidecar in the pod) does the same, then the agent exits; with ``aws`` alone a
  SIGTERM only stops the agent (the machine is not going).

What to send is decided by ``decide.NoticeDecider`` (pure); this module only reads, logs and
sends. A bad or missing document, an unreachable metadata service or a broker that does not
acknowledge is one log line (once per change, not per poll) and no notice; the agent keeps
polling, and an unsent notice is sent again at the next poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import encode
from schemas.contract import PreemptionNotice
from schemas.kafka_config import KafkaSettings
from workers.capacity.decide import (
    MetadataError,
    NoticeDecider,
    parse_instance_action,
    parse_rebalance,
)
from workers.capacity.imds import Imds, ImdsError
from workers.capacity.quiet import OncePerChange

log = logging.getLogger("surplus.capacity_agent")
T = TypeVar("T")

INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"


class NoticeSender:
    """Sends notices to the preemption topic, keyed by region, and waits for the broker."""

    def __init__(self, kafka: KafkaSettings, client_id: str) -> None:
        self.kafka = kafka
        self.producer = kafka_clients.notice_producer(kafka, **{"client.id": client_id})

    def send(self, notice: PreemptionNotice, timeout_s: float = 10.0) -> bool:
        """True once the broker acknowledged ``notice``."""
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        kafka_clients.produce_waiting(self.producer, self.kafka.topic("preemption"),
                                      key=notice.region.encode(), value=encode(notice),
                                      on_delivery=delivered)
        left = self.producer.flush(timeout_s)
        if left or failed:
            log.error("notice %s not acknowledged by Kafka at %s: %s", notice.notice_id,
                      self.kafka.bootstrap, failed[0] if failed else "timed out")
            return False
        return True

    def close(self) -> None:
        self.producer.flush(5.0)


class CapacityAgent:
    """Turns one replica's platform signals into notices; ``run`` polls until ``stop``."""

    def __init__(self, decider: NoticeDecider, send: Callable[[PreemptionNotice], bool], *,
                 imds: Imds | None = None, poll_s: float = 2.0, grace_s: float = 30.0,
                 clock: Callable[[], int] = wall_ms) -> None:
        self.decider = decider
        self.send = send
        self.imds = imds
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.clock = clock
        self.stop = threading.Event()
        self.unsent: list[PreemptionNotice] = []
        self._lock = threading.Lock()
        self._log = OncePerChange(lambda line: log.warning("%s", line))

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
            self.unsent += [n for n in notices if n is not None]
        return self.flush()

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
        with self._lock:
            if self.unsent:
                return None
            return min(self.decider.sent, key=lambda n: n.deadline_ms, default=None)

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
