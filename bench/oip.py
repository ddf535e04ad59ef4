"""Benchmark: notice -> optional work stopped, worker in front of a model server vs in process.

A worker whose batches go to a model server over the Open Inference Protocol (MLServer from
PyPI, in .venv-mlserver, serving a scikit-learn ranker of the worker's input shape) must stop
optional work on a notice as fast as the worker that scores with torch in its own process: the
notice path (admission's lock, the target state) is the same, and what differs is what the
inference thread is doing when the notice comes (a forward pass in torch, or waiting on a
socket after encoding JSON). Both workers run in this one process, each under its own steady
load of requests with optional extra candidates (``bench.preemption``'s) throughout, and the
notices alternate between them (A B, B A, ...), so that whatever else the machine is doing,
the model server's own CPU included, weighs on both alike. Notices go the direct
path, ``POST /v1/preempt`` to each worker's own HTTP server (no broker: the Kafka part is the
same for both and ``surplus bench shed`` measures it); after each one newer targets turn
optional work back on. Measured as ``bench.preemption`` does: ``perf_counter_ns`` at send to
the worker's preemption listener, which runs once admission and target state have stopped
optional work (the same instant ``surplus_worker_preemption_reaction_seconds`` observes).
The start-up heap is frozen once both workers run, as ``surplus worker`` freezes its own.

The target: the OIP worker's p99 within 1.2x the in-process worker's (``ratio_p99``). Also
reported: optional rows a notice caught in service and discarded (never used), per backend.

    python -m bench.oip [--notices 300] [--gap-ms 10] [--load-rps 200]

Prints one JSON line; ``run(...)`` returns the same dict for ``surplus bench oip``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.mlserver import MLServer, build_repository
from bench.preemption import POOL, _load, _summary, _targets
from schemas.clock import wall_ms
from schemas.contract import PreemptionNotice
from schemas.heap import freeze_startup_heap
from workers.capacity.direct import DirectNotices
from workers.runtime.config import load_config
from workers.runtime.server import GIL_SWITCH_INTERVAL_S, create_app
from workers.runtime.worker import Worker

TARGET_RATIO = 1.2
#: Notices per worker before measuring: the HTTP connections and the first passes warm up.
WARMUP_NOTICES = 20


@dataclass
class Side:
    """One worker under test, with its HTTP server and what was measured on it."""

    name: str
    worker: Worker
    url: str = ""
    runner: web.AppRunner | None = None
    epoch: int = 1
    sends: dict[str, int] = field(default_factory=dict)
    stopped: dict[str, int] = field(default_factory=dict)
    requests: int = 0


def _config(name: str, overrides: dict[str, Any]) -> Any:
    return load_config(None, {"worker_id": f"bench-{name}", "tier": "opportunistic",
                              "pool_id": POOL, "model.device": "cpu", **overrides})


async def _start(side: Side) -> None:
    await side.worker.start()
    side.worker.preemption_listeners.append(
        lambda notice, ns: side.stopped.__setitem__(notice.notice_id, ns))
    side.runner = web.AppRunner(create_app(side.worker))
    await side.runner.setup()
    site = web.TCPSite(side.runner, "127.0.0.1", 0)
    await site.start()
    side.url = f"http://127.0.0.1:{side.runner.addresses[0][1]}"
    side.worker.offer_targets(_targets(side.epoch))


async def _notice(side: Side, direct: DirectNotices, prefix: str) -> None:
    """One notice to one worker, then newer targets that turn its optional work back on."""
    notice_id = f"{prefix}-{side.name}-{side.epoch}"
    ts = wall_ms()
    notice = PreemptionNotice(notice_id=notice_id, ts_ms=ts, region="eu1", pool_id=POOL,
                              deadline_ms=ts + 30_000)
    side.sends[notice_id] = time.perf_counter_ns()
    (posted,) = direct.send(notice, [side.url])
    await asyncio.wrap_future(posted)
    side.epoch += 1
    side.worker.offer_targets(_targets(side.epoch))


def _reaction_ms(side: Side) -> list[float]:
    return [(side.stopped[n] - sent) / 1e6 for n, sent in side.sends.items()
            if n.startswith("bench-") and n in side.stopped]


async def _measure(url: str, notices: int, gap_s: float, load_rps: float) -> dict[str, Any]:
    sides = [Side("inprocess", Worker(_config("inprocess", {}))),
             Side("oip", Worker(_config("oip", {"model.backend": "oip", "model.oip": {
                 "url": url, "model_name": "ranker"}})))]
    direct = DirectNotices(timeout_s=5.0)
    stop = asyncio.Event()
    loads: list[asyncio.Task[int]] = []
    try:
        for side in sides:
            await _start(side)
        # As `surplus worker` does once started: else a full collection of the start-up heap
        # (~100 ms with torch loaded) lands on whichever worker a notice is then reaching.
        freeze_startup_heap()
        loads = [asyncio.create_task(_load(side.worker, load_rps, stop)) for side in sides]
        await asyncio.sleep(0.5)  # the load reaches its steady state
        for i in range(WARMUP_NOTICES + notices):
            prefix = "warmup" if i < WARMUP_NOTICES else "bench"
            for side in sides if i % 2 == 0 else sides[::-1]:
                await _notice(side, direct, prefix)
                await asyncio.sleep(gap_s)
    finally:
        stop.set()
        for side, load in zip(sides, loads, strict=False):
            side.requests = await load
        direct.close()
        for side in sides:
            if side.runner is not None:
                await side.runner.cleanup()
            await side.worker.stop()
    out: dict[str, Any] = {}
    for side in sides:
        measured = _reaction_ms(side)
        sent = sum(1 for n in side.sends if n.startswith("bench-"))
        batcher = side.worker.batcher
        out[side.name] = {
            "notice_to_shed_ms": _summary(measured), "notices": sent,
            "lost": sent - len(measured), "load_requests": side.requests,
            "optional_rows_discarded_in_flight": batcher.optional_rows_discarded,
            "batch_ms_mean": round(1000.0 * batcher.busy_s / max(1, batcher.batches), 3),
            "model": side.worker.model.source if side.worker.model else None}
    return out


def run(notices: int = 300, gap_ms: float = 10.0,
        load_rps: float = 200.0) -> dict[str, Any]:
    """Measure both workers' notice -> optional-work-stopped latency; one JSON-ready dict."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # what a worker process runs with
    try:
        with tempfile.TemporaryDirectory(prefix="surplus-bench-oip-") as tmp:
            repository = build_repository(Path(tmp))
            with MLServer(repository) as server:
                sides = asyncio.run(_measure(server.url, notices, gap_ms / 1000.0, load_rps))
    finally:
        sys.setswitchinterval(before)
    oip, inproc = sides["oip"], sides["inprocess"]
    oip_p99 = oip["notice_to_shed_ms"]["p99"]
    in_p99 = inproc["notice_to_shed_ms"]["p99"]
    ratio = round(oip_p99 / in_p99, 3) if in_p99 else None
    return {"bench": "oip", "server": "mlserver 1.7.1", "path": "direct (POST /v1/preempt)",
            "notices_per_backend": notices, "load_rps_per_backend": load_rps,
            "oip_notice_to_shed_p99_ms": oip_p99, "inprocess_notice_to_shed_p99_ms": in_p99,
            "ratio_p99": ratio, "oip": oip, "inprocess": inproc,
            "target_ratio": TARGET_RATIO,
            "meets_target": ratio is not None and ratio <= TARGET_RATIO}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notices", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--load-rps", type=float, default=200.0)
    args = parser.parse_args()
    print(json.dumps(run(args.notices, args.gap_ms, args.load_rps)))


if __name__ == "__main__":
    main()
