"""The precompute lever's pure rules: commits never pass an unanswered job, slices fit the
measured cost, answers are the same however often a job is scored, and only lent capacity
under fresh targets does the work."""

from __future__ import annotations

import pytest

from workers.policy.precompute import (
    OffsetLedger,
    Pace,
    chunk_rows,
    may_precompute,
    top_k,
)
from workers.policy.targets import EffectiveTargets, baseline_only


def test_a_commit_stops_at_the_first_job_still_open_and_moves_once_it_is_answered() -> None:
    ledger = OffsetLedger()
    for offset in (10, 11, 12):
        ledger.take(0, offset)
    ledger.done(0, 11)  # answered out of order
    assert ledger.commits() == {0: 10}
    ledger.done(0, 10)
    assert ledger.commits() == {0: 12}
    assert ledger.commits() == {}  # nothing moved since
    ledger.done(0, 12)
    assert ledger.commits() == {0: 13}
    assert ledger.open_jobs() == 0


def test_partitions_are_committed_apart_and_a_dropped_one_is_forgotten() -> None:
    ledger = OffsetLedger()
    ledger.take(0, 5)
    ledger.take(1, 7)
    ledger.done(1, 7)
    assert ledger.commits() == {0: 5, 1: 8}
    ledger.drop([0])
    ledger.done(0, 5)  # a late answer for a partition given up: its new owner reads it again
    assert ledger.commits() == {} and ledger.open_jobs() == 0


def test_a_slice_takes_about_the_chunk_at_the_measured_cost_and_at_least_one_row() -> None:
    assert chunk_rows(0.01, 2.0, 512) == 200
    assert chunk_rows(0.001, 2.0, 512) == 512  # never more than a batch
    assert chunk_rows(5.0, 2.0, 512) == 1  # one row costs more than the chunk: one row
    assert chunk_rows(None, 2.0, 512) == 512  # nothing measured yet: one batch


def test_the_best_candidates_come_first_and_ties_break_the_same_way_every_time() -> None:
    ids, scores = top_k([7, 3, 9, 1], [0.5, 0.9, 0.5, 0.1], 3)
    assert ids == [3, 7, 9] and scores == [0.9, 0.5, 0.5]
    assert top_k([9, 7, 3, 1], [0.5, 0.5, 0.9, 0.1], 3) == (ids, scores)


def test_only_a_lent_replica_under_fresh_targets_precomputes() -> None:
    fresh = EffectiveTargets(extra_candidates=8, coverage=0.5, budget_units_per_s=1e3,
                             segments={}, epoch=3, baseline_only=False, reason="applied")
    assert may_precompute("opportunistic", fresh)
    assert not may_precompute("baseline", fresh)
    for reason in ("preempted", "stale", "no_targets"):
        assert not may_precompute("opportunistic", baseline_only(reason))


def test_idle_work_is_paced_toward_the_share_of_the_quota_the_process_may_use() -> None:
    pace = Pace(cores=0.5, max_share=0.8)  # a target of 0.4 of a core in all
    assert pace.share == pytest.approx(0.2)  # half the target to start
    pace.after(0.002, 10.0)  # a 2 ms slice at 0.2 of a core: rest 8 ms
    assert pace.ready_in(10.0) == pytest.approx(0.008)
    assert pace.ready_in(10.009) == 0.0
    pace.update(0.25)  # under the target: more
    assert pace.share == pytest.approx(0.275)
    for _ in range(20):
        pace.update(0.6)  # over it (requests, Kafka, decoding count too): less, to the floor
    assert pace.share == pace.floor
    assert Pace(cores=4.0, max_share=0.8).share == 1.0  # one thread, one core at most


def test_the_pace_settles_where_the_process_uses_its_target() -> None:
    pace = Pace(cores=0.5, max_share=0.8)
    overhead = 0.05  # what the process uses besides precompute
    for _ in range(50):
        pace.update(overhead + pace.share)
    assert overhead + pace.share == pytest.approx(0.4, abs=1e-3)


def test_the_control_planes_share_lowers_the_pace_never_past_the_replicas_own_and_0_stops_it(
) -> None:
    pace = Pace(cores=0.5, max_share=0.8)
    pace.allow(0.4)
    assert pace.target == pytest.approx(0.2)
    pace.allow(1.0)                      # the replica's own max_share still caps it
    assert pace.target == pytest.approx(0.4)
    pace.allow(None)                     # targets that do not set it: the replica's own
    assert pace.target == pytest.approx(0.4)
    off = EffectiveTargets(extra_candidates=8, coverage=0.5, budget_units_per_s=1e3,
                           segments={}, epoch=3, baseline_only=False, reason="applied",
                           precompute_share=0.0)
    assert not may_precompute("opportunistic", off)
