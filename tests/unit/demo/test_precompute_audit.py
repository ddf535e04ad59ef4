"""The demo's audit of the precompute jobs (`surplus.demo.precompute_audit.classify`): each
job answered, open at or past its group's commit, or behind it unanswered, where only an
expired job that a worker's skip count covers is not lost."""

from __future__ import annotations

from collections import Counter

from schemas.contract import ModelKind
from schemas.precompute import PrecomputeJob
from surplus.demo.precompute_audit import classify

NOW = 1_000_000


def _job(key: str, expires_ms: int, model: ModelKind = "baseline") -> PrecomputeJob:
    return PrecomputeJob(job_key=key, scope="eu1", segment="s", model=model,
                         issued_at_ms=NOW - 90_000, expires_at_ms=expires_ms, body=b"\x80",
                         top=10)


def test_each_job_is_answered_open_or_behind_the_commit() -> None:
    jobs = [(0, 0, _job("a", NOW + 1)),          # answered (twice)
            (0, 1, _job("b", NOW + 1)),          # behind the commit, not expired: lost
            (0, 2, _job("c", NOW - 1)),          # behind the commit, expired: skipped
            (0, 3, _job("d", NOW + 1)),          # at the commit: open
            (1, 0, _job("e", NOW - 1, "powerful"))]  # the powerful group's: behind, expired
    answers = Counter({("a", NOW - 90_000): 2})
    commits = {"baseline": {0: 3}, "powerful": {1: 1}}
    out = classify(jobs, answers, commits, NOW, expired_skips=2)
    assert out == {"checked": True, "jobs_asked": 5, "jobs_answered": 1, "jobs_open": 1,
                   "jobs_expired_skipped": 2, "jobs_lost": 1, "answers": 2,
                   "answers_duplicate": 1}


def test_expired_jobs_the_workers_did_not_count_as_skipped_are_lost() -> None:
    jobs = [(0, i, _job(f"k{i}", NOW - 1)) for i in range(3)]
    out = classify(jobs, Counter(), {"baseline": {0: 3}}, NOW, expired_skips=1)
    assert out["jobs_expired_skipped"] == 1 and out["jobs_lost"] == 2
