"""The simulator's decision sample (`sim.sampling`): the event log holds what clients logging
a share of their decisions would write, every process agrees which (request-id hash), and
replaying that log gives the run's own estimates."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from schemas.contract import SAMPLED_VERSION
from sim.engine import Simulation
from sim.sampling import SampledSimulation, make_simulation
from sim.scenario import find_scenario, load_scenario
from streams.eventlog import LabelLogEvent, OutcomeEvent, read_events
from streams.replay import replay_offline
from workers.policy.sampling import decision_inclusion


def test_a_sampled_run_logs_the_hashed_share_and_replays_to_its_estimates(
        tmp_path: Path) -> None:
    scenario, base = load_scenario(find_scenario("azure_steady"), duration_s=120.0)
    assert type(make_simulation(scenario, base, "surplus", tmp_path / "x")) is Simulation
    rate = 0.1
    sampled = msgspec.structs.replace(scenario, client=msgspec.structs.replace(
        scenario.client, decision_sample=rate))
    sim = make_simulation(sampled, base, "surplus", tmp_path / "sim")
    assert isinstance(sim, SampledSimulation)
    summary = sim.run()
    log = tmp_path / "sim" / "events.jsonl.zst"
    events = list(read_events(log))
    records = [e.value for e in events if isinstance(e, OutcomeEvent)]
    labels = [e.value for e in events if isinstance(e, LabelLogEvent)]
    treated = [r for r in records if not r.holdout]
    holdout = [r for r in records if r.holdout]
    assert treated and holdout
    assert all(r.v == SAMPLED_VERSION and r.inclusion == rate for r in treated)
    assert all(r.sample_weight == 1.0 for r in holdout)
    assert all(decision_inclusion(r.request_id, rate, False) == rate for r in treated)
    dropped = summary["decisions_unsampled"]["outcomes"]
    share = len(treated) / (len(treated) + dropped)
    assert abs(share - rate) < 0.02
    logged = {r.request_id for r in records}
    assert all(label.request_id in logged for label in labels)   # the rest were never sent
    assert summary["labels"]["eu1"]["labels_orphan"] == 0

    one = replay_offline(log, sampled.control, tmp_path / "one")
    assert one["rejected"] == {}
    estimates = json.loads((tmp_path / "one" / "estimates.json").read_bytes())["eu1"]
    assert (round(estimates["lift"]["all"]["measured"], 6)
            == summary["lift"]["eu1"]["all"]["lift_measured"])
