"""SIGTERM, the way Kubernetes and spot termination end a worker, on a real process and broker:
not ready at once, optional work stopped at once, a notice for itself with the grace period as
its notice on the preemption topic, the baseline work in flight finished, exit within the
grace period."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from schemas.clock import wall_ms
from schemas.codec import decode
from schemas.contract import ControlTargets, PreemptionNotice, RmaTarget, SbmTarget
from schemas.kafka_config import KafkaSettings
from tests.integration.fleet import NUM_DENSE, NUM_SPARSE, REGION, RMA_POOL, WorkerProc
from tests.integration.harness import TopicReader, publish

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

GRACE_S = 5.0
#: Requests wait this long for their batch: long enough to be in flight when SIGTERM lands.
BATCH_WAIT_MS = 900.0
REQUESTS, EXTRA = 4, 4


def _rank(url: str, request_id: str) -> tuple[int, dict[str, Any]]:
    candidates = [{"id": i, "sparse": [i % 7] * NUM_SPARSE} for i in range(2 + EXTRA)]
    body = json.dumps({"request_id": request_id, "segment": "all", "dense": [0.1] * NUM_DENSE,
                       "candidates": candidates, "base_count": 2, "value": 1.0,
                       "deadline_ms": 5_000.0}).encode()
    req = urllib.request.Request(url + "/v1/rank", data=body,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_sigterm_drains_in_order_and_tells_the_control_plane(kafka: KafkaSettings,
                                                             tmp_path: Path) -> None:
    now = wall_ms()
    publish(kafka, "targets", [(REGION, ControlTargets(
        scope=REGION, epoch=1, issued_at_ms=now, ttl_ms=600_000,
        rma=RmaTarget(extra_candidates=4, budget_units_per_s=1e6), sbm=SbmTarget(coverage=0.0)))])
    notices = TopicReader(kafka, "preemption")
    worker = WorkerProc(tmp_path, "w1", tier="opportunistic", kafka=kafka,
                        max_wait_ms=BATCH_WAIT_MS,
                        extra_toml=f"shutdown_grace_s = {GRACE_S}")
    try:
        worker.wait_ready()
        assert _rank(worker.url, "warm")[1]["optional_scored"] == 4
        answers: list[tuple[int, dict[str, Any]]] = []
        threads = [threading.Thread(target=lambda i=i: answers.append(
            _rank(worker.url, f"r{i}"))) for i in range(REQUESTS)]
        for thread in threads:
            thread.start()
        queued = 'surplus_worker_queued_optional_units'
        waited = time.monotonic()
        while worker.metrics().get(queued) != REQUESTS * EXTRA:  # all admitted, none served
            assert time.monotonic() - waited < BATCH_WAIT_MS / 2000.0, worker.metrics()
            time.sleep(0.02)
        signalled = time.monotonic()
        worker.send(signal.SIGTERM)
        not_ready_after = None
        while time.monotonic() - signalled < 2.0:
            try:
                status, _ = worker.get("/readyz", timeout_s=0.5)
            except OSError:   # the listening socket is closed: not ready either
                status = 0
            if status != 200:
                not_ready_after = time.monotonic() - signalled
                break
            time.sleep(0.01)
        for thread in threads:
            thread.join(10)
        code = worker.wait(GRACE_S + 5)
        exited_after = time.monotonic() - signalled
        msg = notices.wait_for(lambda m: b'"replicas":["w1"]' in m.value(), timeout_s=10)
    finally:
        if worker.alive():
            worker.kill()
        notices.close()
    print(f"SIGTERM: not ready after {not_ready_after}, exited after {exited_after:.2f} s, "
          f"answers {[(s, a.get('scored'), a.get('shed_reason')) for s, a in answers]}")
    assert not_ready_after is not None and not_ready_after < 1.0
    assert code == 0 and exited_after < GRACE_S, worker.output()[-3000:]
    # The baseline work in flight was finished; its optional work stopped at the signal.
    assert len(answers) == REQUESTS
    assert all(status == 200 and a["scored"] == 2 and a["shed_reason"] == "preemption"
               for status, a in answers), answers
    assert msg is not None, worker.output()[-3000:]
    notice = decode(PreemptionNotice, msg.value())
    assert notice.pool_id == RMA_POOL and notice.replicas == ["w1"]
    assert notice.deadline_ms - notice.ts_ms == int(GRACE_S * 1000)
    assert notice.accelerator_units == 1.0
