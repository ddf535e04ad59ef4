"""The load generator's books over real HTTP (contract workers on loopback, no Kafka): every
request counted once, every extra candidate on offer accounted for exactly once — done, shed by
a worker, cut by the client or not targeted — and the true value of what was done."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from schemas.clock import wall_ms
from surplus.live import loadgen, plan
from tests.unit.client.contract_worker import Worker, serve
from tests.unit.policy.helpers import targets
from workers.client.client import RankingClient

ARRIVALS = 40


async def _run(tmp_path: Path, ranking: Worker, extra: int) -> dict[str, object]:
    scenario, _ = plan.load("demo", 30.0)
    region = scenario.regions[0]
    servers = [await serve(ranking), await serve(Worker("powerful"))]
    urls = [str(s.make_url("")).rstrip("/") for s in servers]
    config = loadgen.client_config(scenario, region, [urls[0]], [urls[1]])
    books: list[loadgen.LoadGenerator] = []
    client = RankingClient(config)
    gen = loadgen.LoadGenerator(scenario, region, client,
                                np.linspace(0.0, 400.0, ARRIVALS), tmp_path,
                                num_dense=13, num_sparse=8)
    books.append(gen)
    await client.start()
    client.apply_targets(targets(coverage=0.0, extra=extra, budget=1e9,
                                 issued_at_ms=wall_ms()))
    await asyncio.sleep(0.05)  # the RMA budget bucket starts empty
    try:
        summary = await gen.run(wall_ms(), asyncio.Event())
    finally:
        await client.close()
        for s in servers:
            await s.close()
    return summary


async def test_every_request_and_every_offered_candidate_is_counted_once(
        tmp_path: Path) -> None:
    summary = await _run(tmp_path, Worker("baseline"), extra=20)
    assert summary["requests"] == ARRIVALS and summary["failed"] == 0
    region = plan.load("demo")[0].regions[0]
    fate = summary["optional_fate"]
    assert isinstance(fate, dict)
    assert sum(fate.values()) == ARRIVALS * region.max_extra_candidates
    assert fate["done"] == summary["extra_scored"] == summary["extra_sent"]
    assert fate["untargeted/below_demand"] == ARRIVALS * (region.max_extra_candidates - 20)
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert len(rows) == ARRIVALS and all(r["ok"] == "1" for r in rows)
    lines = [json.loads(x) for x in (tmp_path / "loadgen.jsonl").read_text().splitlines()]
    assert sum(line["requests"] for line in lines) == ARRIVALS
    assert summary["incremental_value"] == pytest.approx(
        sum(float(r["gain_rma"]) + float(r["gain_sbm"]) + float(r["gain_precompute"])
            for r in rows), abs=1e-4)
    held = summary["holdout_requests"]          # the holdout gets no optional work, booked
    assert isinstance(held, int) and fate.get("client/holdout", 0) == 20 * held
    assert summary["incremental_value"] == pytest.approx(
        (ARRIVALS - held) * loadgen.rma_value(region, 20), rel=1e-3)


async def test_candidates_a_worker_sheds_are_booked_as_shed_not_done(tmp_path: Path) -> None:
    summary = await _run(tmp_path, Worker("baseline", shed_optional=True), extra=20)
    fate = summary["optional_fate"]
    assert isinstance(fate, dict)
    sent = summary["extra_sent"]
    assert isinstance(sent, int) and sent > 0
    assert fate.get("done", 0) == 0 and fate["worker/overload"] == sent
    assert summary["incremental_value"] == 0.0


async def test_request_rows_are_written_as_the_run_goes_not_held_to_the_end(
        tmp_path: Path) -> None:
    scenario, _ = plan.load("demo", 30.0)
    region = scenario.regions[0]
    config = loadgen.client_config(scenario, region, ["http://127.0.0.1:9"], [])
    gen = loadgen.LoadGenerator(scenario, region, RankingClient(config), np.zeros(0), tmp_path,
                                num_dense=13, num_sparse=8)
    await gen.run(wall_ms(), asyncio.Event())  # writes the header
    for i in range(3):
        gen._record_failure(float(10 - i), "refused")
    gen._flush_second()
    assert gen.rows == []  # the generator's memory does not grow with the run's length
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert [r["t_ms"] for r in rows] == ["8.0", "9.0", "10.0"]
    assert {r["error"] for r in rows} == {"refused"}
