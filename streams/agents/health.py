"""`/healthz` and `/readyz` of a control-plane process, served beside `/metrics` on its port.

An orchestrator asks two things of the control plane. *Alive* (`/healthz`): is the process's
event loop still turning? A wedged loop publishes nothing yet keeps its partitions until the
session times out, so restarting it is the cure. *Ready* (`/readyz`): is it doing its job for
the scopes it owns? That is three facts: the group has given it its partitions, their state has
been read back from the changelog (before that a tick would restart epochs and integrators),
and every owned partition has ticked within the last two control periods (ticks travel through
Kafka, so a fresh tick proves the whole loop: timer, broker, agent). A process the group gives
no partition (a standby beside as many processes as partitions) is ready: it owns nothing to
tick, and counting it out would stall a rolling restart forever.

The verdicts are pure functions of what the agents record (``HealthState``) and a time passed
in, so they are tested without a broker; ``serve`` is the thin HTTP edge (a thread, as
prometheus-client's own server is).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

LOOP_STALL_MIN_MS = 30_000
"""A loop silent this long (or ten tick intervals, if longer) is stalled: far beyond any GC
pause or loaded-machine delay, so a busy process is never restarted for being busy."""


@dataclass
class HealthState:
    """What the agents record for the probes (written on the event loop, read by the HTTP
    thread: each field is replaced whole, never mutated in place, so a reader sees a value)."""

    period_ms: int
    """The shortest control period in use: a partition must tick within two of them."""
    tick_interval_ms: float
    assigned: frozenset[int] | None = None
    """Partitions the group gave this process; None until the first assignment and during a
    rebalance (between revocation and the new assignment)."""
    restoring: frozenset[int] = frozenset()
    last_tick_ms: dict[int, int] = field(default_factory=dict)
    """Wall time each owned partition's last tick was handled."""
    loop_beat_ms: int | None = None
    """Wall time the event loop last ran the tick timer (None before the app started)."""

    def on_assigned(self, partitions: Iterable[int], restoring: Iterable[int]) -> None:
        self.restoring = frozenset(restoring)
        self.assigned = frozenset(partitions)
        self.last_tick_ms = {p: t for p, t in self.last_tick_ms.items() if p in self.assigned}

    def on_restored(self) -> None:
        self.restoring = frozenset()

    def on_revoked(self) -> None:
        self.assigned = None

    def on_tick(self, partition: int, now_ms: int) -> None:
        self.last_tick_ms = {**self.last_tick_ms, partition: now_ms}

    def on_beat(self, now_ms: int) -> None:
        self.loop_beat_ms = now_ms


def liveness(state: HealthState, now_ms: int) -> list[str]:
    """Why the process is not alive (empty: alive). Starting up counts as alive."""
    if state.loop_beat_ms is None:
        return []
    bound = max(LOOP_STALL_MIN_MS, 10 * state.tick_interval_ms)
    silent = now_ms - state.loop_beat_ms
    if silent > bound:
        return [f"event loop stalled: the tick timer last ran {silent / 1000:.1f} s ago "
                f"(bound {bound / 1000:.0f} s)"]
    return []


def readiness(state: HealthState, now_ms: int) -> list[str]:
    """Why the process is not ready (empty: ready), one reason per unmet condition."""
    assigned = state.assigned
    if assigned is None:
        return ["no partition assignment from the consumer group yet (starting or rebalancing)"]
    reasons = []
    restoring = sorted(state.restoring & assigned)
    if restoring:
        reasons.append(f"reading back the state of partitions {restoring} from the changelog")
    bound = 2 * state.period_ms
    ticks = state.last_tick_ms
    for p in sorted(assigned):
        at = ticks.get(p)
        if at is None:
            reasons.append(f"partition {p}: no tick handled since it was assigned")
        elif now_ms - at > bound:
            reasons.append(f"partition {p}: last tick {(now_ms - at) / 1000:.1f} s ago "
                           f"(more than two periods, {bound / 1000:g} s)")
    return reasons


def probe_body(name: str, reasons: list[str], state: HealthState) -> tuple[int, bytes]:
    """HTTP status and JSON body of a probe: 200 when no reason, else 503 with the reasons."""
    body = {"status": "ok" if not reasons else f"not {name}", "reasons": reasons,
            "partitions": sorted(state.assigned) if state.assigned is not None else None}
    return (200 if not reasons else 503), json.dumps(body).encode()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


def serve(host: str, port: int, registry: CollectorRegistry, state: HealthState,
          clock: Callable[[], int]) -> ThreadingWSGIServer:
    """Serve `/metrics` (and any other path, as prometheus-client does), `/healthz` and
    `/readyz` on one port from a daemon thread; returns the server (``shutdown()`` stops it)."""
    metrics = make_wsgi_app(registry)
    probes = {"/healthz": ("alive", liveness), "/readyz": ("ready", readiness)}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics(environ, start_response)
        name, verdict = probe
        status, body = probe_body(name, verdict(state, clock()), state)
        start_response(f"{status} {'OK' if status == 200 else 'Service Unavailable'}",
                       [("Content-Type", "application/json"),
                        ("Content-Length", str(len(body))), ("Cache-Control", "no-store")])
        return [body]

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="control-plane-http",
                     daemon=True).start()
    return server
