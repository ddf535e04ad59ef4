"""A key rotated while the demo runs, and forgeries produced by kcat into its topics.

One `surplus demo` run (its own embedded broker, the light models of `test_demo`, a storm
brought forward so that the reclaimed replicas are back well before the end) with the three
rotation steps done by changing files of its key directory (`tests.faults.rotation`): 0
genuine messages refused by any receiver, by the refusal counters of each and by the
dead-letter topic; then, with the old key retired, forged messages written by kcat are all
refused, counted by reason by every receiver of their topic and dead-lettered, none applied,
and the baseline requests all served. Replayed targets past their TTL (one signed with the
retired key, one with the new) are dropped as expired by every reader before their signature
is judged, and not dead-lettered.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import pytest

from schemas.signing import REFUSALS
from surplus.demo.options import DemoOptions
from tests.faults.conftest import Figures
from tests.faults.rotation import (
    FORGED_EPOCH_JUMP,
    FORGERIES,
    NEW,
    OLD,
    Observed,
    RotatingDemo,
    count,
    samples,
)
from tests.integration.test_demo import _light_demo

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(720)]

DURATION_S = 180.0
#: The storm at 65 s of the 180 (not 100), the capacity back 20 s later (not 40): signing has
#: switched well before the storm (about 45 s in: the replicas lent at 8 and 14 s are ready
#: first), and the returned replicas are ready long before the retirement and the forgeries,
#: both well before the end.
STORM = ("[[storms]]\nat_s = 100.0\nshare = 1.0\nnotice_s = 1.0\nreturn_after_s = 40.0\n",
         "[[storms]]\nat_s = 65.0\nshare = 1.0\nnotice_s = 1.0\nreturn_after_s = 20.0\n")
REJECTED = "surplus_control_rejected_total"
NOTICES = "surplus_worker_preemption_notices_total"
VERDICTS = "surplus_worker_target_verdicts_total"


@dataclass
class Run:
    rc: int
    error: str | None
    observed: Observed
    summary: dict[str, Any]
    client_targets: dict[str, int]
    log: list[str]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("rotation")
    scenario = _light_demo(tmp)
    text = scenario.read_text()
    assert STORM[0] in text, "demo.toml's storm moved; update this test"
    scenario.write_text(text.replace(*STORM))
    out = tmp / "demo"
    log: list[str] = []

    def say(line: str) -> None:
        log.append(line)
        print(line)

    with pytest.MonkeyPatch.context() as env:   # the demo's own embedded broker
        env.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
        env.delenv("SURPLUS_KAFKA_BOOTSTRAP", raising=False)
        demo = RotatingDemo(DemoOptions(out=out, duration_s=DURATION_S, scenario=str(scenario),
                                        rate=20.0), say=say)
        rc = demo.run()
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    loadgen_path = out / "loadgen" / "loadgen.json"
    client = (json.loads(loadgen_path.read_text())["client"]["targets"]
              if loadgen_path.is_file() else {})
    return Run(rc, demo.error, getattr(demo, "observed", Observed()), summary, client, log)


def _ran(run: Run) -> Observed:
    o = run.observed
    tail = "\n".join(run.log[-40:])
    assert run.rc == 0 and run.error is None, f"demo ended {run.rc}: {run.error}\n{tail}"
    assert [s.name for s in o.steps] == ["add", "switch", "retire"], tail
    assert all(s.done_s is not None for s in o.steps), tail
    assert o.forged_at_s is not None and o.final_at_s is not None, tail
    return o


def _refusals(text: str | None, name: str, label: str) -> dict[str, float]:
    """``name``'s samples by refusal reason (``label``: the label the reason is under)."""
    scraped = samples(text)
    return {r: count(scraped, name, **{label: r}) for r in sorted(REFUSALS)}


def _delta(o: Observed, process: str, name: str, **labels: str) -> float:
    return (count(samples(o.after[process]), name, **labels)
            - count(samples(o.before[process]), name, **labels))


def test_a_rotation_during_the_demo_refuses_no_genuine_message(run: Run,
                                                               figures: Figures) -> None:
    o = _ran(run)
    figures.add("rotation steps taken everywhere (s into the load)",
                {s.name: [round(s.at_s, 1), round(s.done_s or 0.0, 1)] for s in o.steps})
    zero = dict.fromkeys(sorted(REFUSALS), 0.0)
    # Until the forgeries (old key retired by then), no receiver refused anything: the control
    # plane (grants, notices), every worker (targets, notices), and the reclaimed replicas'
    # lives, scraped as they stopped (they applied the storm's notices, signed with the new key).
    assert _refusals(o.before["control-plane"], REJECTED, "reason") == zero
    for worker in o.workers:
        assert _refusals(o.before[worker], NOTICES, "outcome") == zero, worker
        assert _refusals(o.before[worker], VERDICTS, "verdict") == zero, worker
        taken = samples(o.before[worker])
        assert count(taken, VERDICTS, verdict="applied") + count(
            taken, VERDICTS, verdict="clamped") > 0, worker
    assert len(o.reclaimed) >= 2, o.reclaimed.keys()
    for life, text in o.reclaimed.items():
        assert _refusals(text, NOTICES, "outcome") == zero, life
        assert _refusals(text, VERDICTS, "verdict") == zero, life
        assert count(samples(text), NOTICES, outcome="applied") >= 1, life
    # The load generator's client, over the whole run: only the one fresh target forged with
    # the retired key was refused (the replayed old one is expired, not refused).
    assert {r: run.client_targets.get(r, 0) for r in REFUSALS} == {
        **dict.fromkeys(REFUSALS, 0), "unknown_key": 1}, run.client_targets
    # Nothing but the forgeries was dead-lettered.
    ours = {bytes(v) for v in o.forged.values()}
    genuine = [d for d in o.deadletters if base64.b64decode(d.value_b64) not in ours]
    assert genuine == [], [(d.source_topic, d.reason) for d in genuine]
    # Both keys signed the control plane's targets, the new one last; after the retirement the
    # fleet ran on the new key alone: targets went on, and the scheduler's grants were taken.
    # (The target forged with the retired key is on the topic too, under its forged epoch.)
    targets = [t for t in o.targets if t.epoch < FORGED_EPOCH_JUMP]
    assert len(o.targets) - len(targets) == 1
    assert {t.key_id for t in targets} == {OLD, NEW}
    assert targets[-1].key_id == NEW
    retired_ms = o.start_ms + int((o.steps[-1].done_s or 0.0) * 1000)
    since = [t for t in targets if t.issued_at_ms > retired_ms]
    assert len(since) >= 3 and {t.key_id for t in since} == {NEW}, len(since)
    grants = (_delta(o, "control-plane", "surplus_control_events_total", topic="capacity")
              - _delta(o, "control-plane", REJECTED, topic="capacity"))
    figures.add("genuine grants taken after the retirement", grants)
    assert grants >= 3
    assert run.summary["baseline_requests_failed"] == 0
    assert run.summary["opportunistic_replicas_reclaimed"] >= 2


def test_forgeries_by_kcat_are_refused_by_reason_dead_lettered_and_change_nothing(
        run: Run, figures: Figures) -> None:
    o = _ran(run)
    assert o.kcat and all(line.startswith("-P ") for line in o.kcat)
    figures.add("forged by kcat", sorted(o.forged))
    n = len(o.workers)

    # Counted by reason, by every receiver of each topic, and nothing else refused meanwhile.
    plane = {(topic, r): _delta(o, "control-plane", REJECTED, topic=topic, reason=r)
             for topic in ("preemption", "capacity") for r in sorted(REFUSALS)}
    want_plane = {k: 0.0 for k in plane} | {("preemption", "unsigned"): 1.0,
                                            ("preemption", "unknown_key"): 2.0,
                                            ("capacity", "bad_signature"): 1.0,
                                            ("capacity", "unknown_key"): 1.0}
    assert plane == want_plane
    figures.add("control plane refusals (topic/reason)",
                {f"{t}/{r}": v for (t, r), v in plane.items() if v})
    for worker in o.workers:
        notices = {r: _delta(o, worker, NOTICES, outcome=r) for r in sorted(REFUSALS)}
        assert notices == {**dict.fromkeys(sorted(REFUSALS), 0.0), "unsigned": 1.0,
                           "unknown_key": 2.0}, worker
        verdicts = {r: _delta(o, worker, VERDICTS, verdict=r) for r in sorted(REFUSALS)}
        assert verdicts == {**dict.fromkeys(sorted(REFUSALS), 0.0), "unknown_key": 1.0}, worker
        # The two replayed targets, past their TTL: dropped as expired, whatever their key.
        assert _delta(o, worker, VERDICTS, verdict="expired") >= 2, worker
        # None applied: no notice stopped optional work, every worker still serves, and no
        # worker holds the forged epoch.
        assert _delta(o, worker, NOTICES, outcome="applied") == 0, worker
        assert o.ready_at_end[worker], worker
        held = count(samples(o.after[worker]), "surplus_worker_targets_epoch")
        assert held < FORGED_EPOCH_JUMP, (worker, held)
    assert run.client_targets.get("expired", 0) >= 2, run.client_targets

    # Dead-lettered: each copy refused, by each receiver, with its reason; the replayed targets,
    # expired, are counted but not dead letters.
    receivers = {"preemption": 1 + n, "capacity": 1, "targets": n + 1}
    by_name: dict[str, list[str]] = {name: [] for name in FORGERIES}
    for letter in o.deadletters:
        for name, payload in o.forged.items():
            if base64.b64decode(letter.value_b64) == payload:
                by_name[name].append(letter.reason)
    for name, (topic, reason) in FORGERIES.items():
        if reason is None:
            assert by_name[name] == [], name
            continue
        assert len(by_name[name]) == receivers[topic], (name, by_name[name])
        assert all(reason in text for text in by_name[name]), (name, by_name[name])
    figures.add("dead letters per forgery", {k: len(v) for k, v in by_name.items()})

    # The baseline untouched: every request served, no reclaim after the storm's return.
    s = run.summary
    assert s["baseline_requests_failed"] == 0, s.get("baseline_failure_reasons")
    assert s["baseline_sla_violation_windows"] <= 1, s.get("baseline_violations_by_path")
    assert [c for c in o.replica_log if c[0] >= (o.forged_at_s or 0.0)] == [], o.replica_log

