"""A worker in front of a real model server: MLServer (PyPI, in .venv-mlserver) scoring over the
Open Inference Protocol, while the worker keeps admission, batching and shedding.

MLServer serves a scikit-learn ranker this test builds (``infra/mlserver/build_model.py``)
whose weights it can read back, so every score is checked against the model, not only
counted. Without ``.venv-mlserver`` these tests fail, naming ``make mlserver``: they never
skip. Nothing here is timed: the notice is applied while a chosen batch is with the server,
so the check holds on a loaded machine.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.mlserver import MLServer, build_repository, coefficients
from schemas.contract import PreemptionNotice
from tests.integration.worker_support import TINY, notice, running_worker, targets, tiny_config
from workers.api import Candidate, RankRequest, RankResponse, encode
from workers.runtime.config import WorkerConfig
from workers.runtime.models import ModelLoadError
from workers.runtime.oip import OipModel, connect
from workers.runtime.worker import Worker

pytestmark = pytest.mark.slow

POOL = "eu1/rank/baseline/cpu/opportunistic"


@dataclass(frozen=True)
class Server:
    url: str
    repository: Path


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One MLServer for the module, serving `ranker` (the worker's shape), `ranker_wide`
    (declares sparse ids of another width) and `ranker_undeclared` (declares no inputs)."""
    repository = tmp_path_factory.mktemp("mlserver")
    dense, sparse = TINY.num_dense, TINY.num_sparse
    build_repository(repository, name="ranker", num_dense=dense, num_sparse=sparse)
    build_repository(repository, name="ranker_wide", num_dense=dense, num_sparse=sparse,
                     sparse_shape=sparse + 2)
    build_repository(repository, name="ranker_undeclared", num_dense=dense, num_sparse=sparse,
                     declare_inputs=False)
    with MLServer(repository) as server:
        yield Server(server.url, repository)


def oip_config(server: Server, **overrides: Any) -> WorkerConfig:
    oip = {"url": server.url, "model_name": "ranker", "ready_timeout_s": 10.0,
           **overrides.pop("oip", {})}
    return tiny_config(**{"model.backend": "oip", "model.oip": oip, "tier": "opportunistic",
                          **overrides})


def expected_scores(server: Server, dense: list[float], sparse: list[list[int]]) -> np.ndarray:
    """What the ranker gives: the dense features and cos(id) of each sparse id, weighted."""
    c = coefficients(server.repository)
    d = np.asarray(dense, dtype=np.float32).astype(np.float64)
    s = np.cos(np.asarray(sparse, dtype=np.float64))
    return np.asarray(d @ np.asarray(c["dense"]) + s @ np.asarray(c["sparse_cos"])
                      + c["intercept"])


def request(n: int, base: int, extra: int) -> RankRequest:
    """Request `n`: candidate i's first sparse id is n * 1000 + i, so a batch's rows say which
    request and which candidate (baseline below `base`, optional above) they are."""
    rng = np.random.default_rng(n)
    candidates = [Candidate(id=i, sparse=[n * 1000 + i, *rng.integers(
        0, 1 << 30, TINY.num_sparse - 1).tolist()]) for i in range(base + extra)]
    return RankRequest(request_id=f"r{n}", segment="s", value=1.0, deadline_ms=10_000.0,
                       dense=rng.standard_normal(TINY.num_dense).tolist(),
                       candidates=candidates, base_count=base)


async def test_baseline_is_answered_through_the_model_server_with_its_scores(
        mlserver: Server) -> None:
    async with running_worker(oip_config(mlserver)) as (worker, client):
        assert worker.model is not None and worker.model.source.startswith("oip:http://")
        resp = await client.get("/readyz")
        assert resp.status == 200
        sent = [request(n, base=6, extra=0) for n in range(120)]

        async def post(req: RankRequest) -> tuple[int, Any]:
            r = await client.post("/v1/rank", data=encode(req),
                                  headers={"content-type": "application/json"})
            return r.status, await r.json()

        answers = await asyncio.gather(*(post(r) for r in sent))
        failures = [(req.request_id, status) for req, (status, _) in zip(sent, answers,
                                                                         strict=True)
                    if status != 200]
        assert failures == []
        for req, (_, answer) in zip(sent, answers, strict=True):
            want = expected_scores(mlserver, req.dense, [c.sparse for c in req.candidates])
            assert answer["scored"] == 6
            np.testing.assert_allclose(answer["scores"], want, rtol=1e-5, atol=1e-6)
        # Cost measurement is the worker's: the rows the server did, the time they took.
        assert worker.batcher.rows_done == 120 * 6 and worker.batcher.busy_s > 0
        assert worker.batcher.batches < 120  # concurrent requests shared inference calls


@dataclass
class Call:
    """One batch the worker sent the server: when (perf_counter_ns), and its rows' ids."""

    started_ns: int
    ended_ns: int
    first_ids: list[int]
    notice_during: bool


@dataclass
class NoticeMidCall:
    """The worker's model server, wrapped to record each call and to apply a preemption
    notice, on another thread as Kafka's would, while a chosen call is with the server."""

    inner: OipModel
    worker: Worker
    notice: PreemptionNotice
    base: int
    armed: bool = False
    calls: list[Call] = field(default_factory=list)
    source: str = "oip:test"

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        dense, sparse = inputs
        ids = [int(x) for x in sparse[:, 0]]
        fire = self.armed and any(i % 1000 >= self.base for i in ids)  # carries optional rows
        started = time.perf_counter_ns()
        if fire:
            self.armed = False
            thread = threading.Thread(target=self.worker.on_preemption, args=(self.notice,))
            thread.start()
        try:
            return self.inner.score(dense, sparse)
        finally:
            if fire:
                thread.join()  # the notice came before this answer did
            self.calls.append(Call(started, time.perf_counter_ns(), ids, fire))


async def test_a_notice_stops_optional_work_and_no_optional_answer_in_flight_is_used(
        mlserver: Server) -> None:
    base, extra = 4, 4
    worker = Worker(oip_config(mlserver, pool_id=POOL, **{"batching.max_wait_ms": 2.0}))
    inner = await asyncio.to_thread(connect, worker.config.model)
    wrapped = NoticeMidCall(inner, worker, notice(POOL, notice_id="oip-n1"), base)
    stopped_ns: list[int] = []
    worker.preemption_listeners.append(lambda _n, ns: stopped_ns.append(ns))
    await worker.start(model=wrapped)
    try:
        worker.offer_targets(targets(1, extra=extra))
        answers: dict[int, RankResponse] = {}

        async def rank(n: int) -> None:
            answers[n] = await worker.rank(request(n, base, extra))

        async def wave(first: int, count: int, concurrency: int = 8) -> None:
            for start in range(first, first + count, concurrency):
                await asyncio.gather(*(rank(n) for n in range(start, min(
                    start + concurrency, first + count))))

        await wave(0, 40)                      # optional work served before any notice
        wrapped.armed = True
        await wave(40, 80)                     # the notice comes mid-call, the load goes on
        resumed_ns = time.perf_counter_ns()
        worker.offer_targets(targets(2, extra=extra))
        await wave(120, 40)                    # new targets: optional work back
    finally:
        await worker.stop()
    assert len(stopped_ns) == 1, "the notice was never applied"
    notice_ns = stopped_ns[0]
    (fired,) = [c for c in wrapped.calls if c.notice_during]
    in_flight = {i // 1000 for i in fired.first_ids if i % 1000 >= base}
    assert in_flight, "the call the notice came during carried no optional rows"

    def optional_in(calls: list[Call]) -> set[int]:
        return {i // 1000 for c in calls for i in c.first_ids if i % 1000 >= base}

    # Answers used after the notice: requests whose optional rows came back from the server
    # after it, and that were still given optional scores.
    after = optional_in([c for c in wrapped.calls if notice_ns < c.ended_ns < resumed_ns])
    used_after_notice = sorted(n for n in after if answers[n].optional_scored > 0)
    assert used_after_notice == []
    assert in_flight <= after
    for n in in_flight:
        assert answers[n].shed_reason == "preemption" and answers[n].optional_shed == extra
    # Nothing optional was sent to the server between the notice and the new targets.
    sent_after = optional_in([c for c in wrapped.calls if notice_ns < c.started_ns < resumed_ns])
    assert sent_after == set()
    # Every baseline row was answered, with the model's scores; the discarded rows counted.
    for n, answer in answers.items():
        req = request(n, base, extra)
        assert answer.scored >= base
        want = expected_scores(mlserver, req.dense, [c.sparse for c in req.candidates[:base]])
        np.testing.assert_allclose(answer.scores[:base], want, rtol=1e-5, atol=1e-6)
    assert worker.batcher.state().shed_units.get("preemption", 0) >= extra * len(in_flight)
    assert any(answers[n].optional_scored == extra for n in range(40))
    assert any(answers[n].optional_scored == extra for n in range(120, 160))


@pytest.mark.parametrize(("model", "named"), [
    ("ranker_wide", rf"`inputs\[1\]` \(sparse\).shape: \[-1, {TINY.num_sparse + 2}\]; the worker "
                    rf"sends \[-1, {TINY.num_sparse}\]"),
    ("ranker_undeclared", "declares no inputs"),
])
async def test_a_model_whose_metadata_does_not_match_is_refused_at_start_naming_the_field(
        mlserver: Server, model: str, named: str) -> None:
    config = oip_config(mlserver, oip={"model_name": model})
    with pytest.raises(ModelLoadError, match=named):
        await Worker(config).start()


async def test_a_model_declaring_no_inputs_serves_when_the_check_is_turned_off(
        mlserver: Server) -> None:
    config = oip_config(mlserver, oip={"model_name": "ranker_undeclared",
                                       "check_metadata": False})
    async with running_worker(config) as (worker, _):
        answer = await worker.rank(request(1, base=3, extra=0))
        assert answer.scored == 3


async def test_a_server_that_is_not_ready_is_refused_at_start_naming_the_key(
        mlserver: Server) -> None:
    missing = oip_config(mlserver, oip={"model_name": "no_such_model", "ready_timeout_s": 0.5})
    with pytest.raises(ModelLoadError, match=r"`model.oip.url`.*not ready after "
                                             r"`model.oip.ready_timeout_s` = 0.5 s.*no_such_model"):
        await Worker(missing).start()
    from surplus.localkafka import free_port

    nobody = oip_config(mlserver, oip={"url": f"http://127.0.0.1:{free_port()}",
                                       "ready_timeout_s": 0.3})
    with pytest.raises(ModelLoadError, match="not ready after"):
        await Worker(nobody).start()


def test_surplus_worker_exits_naming_the_metadata_field_it_cannot_serve(
        mlserver: Server, tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(f'worker_id = "oip-cli"\n[model]\nbackend = "oip"\n[model.config]\n'
                      f"num_dense = {TINY.num_dense}\nnum_sparse = {TINY.num_sparse}\n"
                      f'[model.oip]\nurl = "{mlserver.url}"\nmodel_name = "ranker_wide"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SURPLUS_KAFKA_")}
    proc = subprocess.Popen([sys.executable, "-m", "surplus.cli", "worker", "--config",
                             str(config), "--port", "0", "--no-kafka", "--loglevel", "warning"],
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1
    assert re.search(r"ranker_wide.*`inputs\[1\]` \(sparse\)\.shape", err), err


def test_the_oip_benchmark_reports_both_backends_and_the_ratio_of_their_p99s() -> None:
    from bench.oip import run

    result = run(notices=10, gap_ms=5.0, load_rps=100.0)
    oip, inproc = result["oip"], result["inprocess"]
    assert oip["model"].startswith("oip:http://127.0.0.1:")
    assert inproc["model"] == "reference:baseline"
    assert (oip["notices"], oip["lost"], inproc["notices"], inproc["lost"]) == (10, 0, 10, 0)
    assert result["ratio_p99"] == round(oip["notice_to_shed_ms"]["p99"]
                                        / inproc["notice_to_shed_ms"]["p99"], 3)
    assert oip["load_requests"] > 0 and inproc["load_requests"] > 0
