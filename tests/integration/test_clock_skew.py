"""Workers whose clocks run 2 s ahead of and 2 s behind the control plane's, as real processes
on a real broker: each keeps every target for its whole TTL, rejects none as from the future
and expires none early, because it reads ages on the sender's clock (an estimated offset).

The TTL (2.5 s) is shorter than one period plus the skew, so a receiver that read ages on its
own clock would drop to baseline only for half of every period (ahead) or hold targets past
their TTL (behind).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schemas.clock import OFFSET_ENV
from schemas.kafka_config import KafkaSettings
from tests.integration.fleet import RMA_POOL, ControlProc, WorkerProc, control_toml, grant

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SKEWS_MS = (2_000, -2_000)
WATCH_S = 6.0


def _verdicts(worker: WorkerProc) -> dict[str, float]:
    prefix = 'surplus_worker_target_verdicts_total{verdict="'
    return {key[len(prefix):-2]: value for key, value in worker.metrics().items()
            if key.startswith(prefix)}


def test_skewed_workers_keep_targets_for_their_ttl_and_refuse_none(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    config = control_toml(tmp_path, period_s=1.0, ttl_s=2.5)
    control = ControlProc(tmp_path, "cp", kafka, app_id=f"{kafka.prefix}cp", config=config)
    workers = [WorkerProc(tmp_path, f"w{i}", tier="opportunistic", kafka=kafka,
                          env={OFFSET_ENV: str(skew)}) for i, skew in enumerate(SKEWS_MS)]
    try:
        grant(kafka, RMA_POOL)
        for worker in workers:
            worker.wait_ready()
        time.sleep(3.0)  # the first target is judged on the raw clocks; the offset follows
        before = [_verdicts(worker) for worker in workers]
        watch_until = time.monotonic() + WATCH_S
        while time.monotonic() < watch_until:  # each scrape reads the targets in force now
            after = [_verdicts(worker) for worker in workers]
            time.sleep(0.1)
        for skew, start, end, worker in zip(SKEWS_MS, before, after, workers, strict=True):
            grew = {k: end.get(k, 0.0) - start.get(k, 0.0) for k in end}
            print(f"clock {skew:+d} ms: verdicts over {WATCH_S:.0f} s {grew}")
            assert grew.get("applied", 0.0) >= WATCH_S - 2, (skew, grew, worker.output()[-2000:])
            # Reading ages on its own clock, the worker ahead expires a target every period
            # (6 in 6 s); one lapse is left for a tick that a loaded machine delays past 1.5 s.
            assert grew.get("held_expired", 0.0) <= 1, (skew, grew)
            assert all(n == 0 for k, n in grew.items() if k not in ("applied", "held_expired")
                       ), (skew, grew)
            status, ready = worker.get("/readyz")
            assert status == 200, ready
    finally:
        for worker in workers:
            worker.stop()
        control.stop()
