"""A client's precompute answers and job plan: one answer per key whoever sent it, none past
its expiry or from another scope, and jobs for the users seen lately, each once per refresh,
within the rate."""

from __future__ import annotations

from schemas.precompute import PrecomputeResult
from workers.policy.precomputed import Answers, JobPlanner, JobWindow


def answer(key: str, issued: int = 1_000, expires: int = 60_000, scope: str = "eu1",
           worker: str = "w1") -> PrecomputeResult:
    return PrecomputeResult(job_key=key, scope=scope, segment="s1", model="baseline",
                            pool_id="eu1/rank/baseline/cpu/opportunistic", worker_id=worker,
                            issued_at_ms=issued, computed_at_ms=issued + 10,
                            expires_at_ms=expires, candidates=3, top_ids=[2, 1],
                            top_scores=[0.9, 0.1])


def test_an_answer_is_used_until_it_expires_and_a_job_answered_twice_is_one_answer() -> None:
    answers = Answers("eu1")
    answers.add(answer("u1", worker="w1"))
    answers.add(answer("u1", worker="w2"))  # a redelivered job, scored again
    assert len(answers) == 1 and answers.counts["duplicate"] == 1
    assert answers.fresh("u1", 59_999) is not None
    assert answers.fresh("u1", 60_000) is None
    assert answers.fresh("u2", 1_000) is None
    assert answers.counts == {"received": 1, "duplicate": 1, "hit": 1, "expired": 1, "miss": 1}


def test_an_older_job_read_late_or_another_scope_does_not_replace_the_answer() -> None:
    answers = Answers("eu1", capacity=2)
    answers.add(answer("u1", issued=2_000))
    answers.add(answer("u1", issued=1_000, expires=90_000))
    answers.add(answer("u9", scope="us2"))
    held = answers.fresh("u1", 10_000)
    assert held is not None and held.issued_at_ms == 2_000
    answers.add(answer("u2"))
    answers.add(answer("u3"))  # past capacity: the oldest key goes
    assert answers.fresh("u1", 10_000) is None and len(answers) == 2


def test_jobs_go_to_the_users_seen_lately_once_per_refresh_within_the_rate() -> None:
    planner = JobPlanner(recent_ms=10_000, refresh_ms=30_000, max_per_s=2.0)
    planner.due(0)
    for i, user in enumerate(["a", "b", "c", "d"]):
        planner.seen(user, i * 100)
    assert planner.due(1_000) == ["d", "c"]  # the rate: two a second, most recent first
    assert planner.due(2_000) == ["b", "a"]
    assert planner.due(3_000) == []  # each has a job within its refresh
    planner.seen("a", 25_000)
    assert planner.due(25_000) == []  # "a"'s last job was 23 s ago, under the refresh
    assert planner.due(32_500) == ["a"]  # "b".."d" were seen too long ago


def test_the_job_window_follows_the_answers_measured_and_forgets_jobs_never_answered() -> None:
    window = JobWindow(horizon_s=2.0, min_window=4, rate_half_life_s=1.0)
    assert window.room(0) == 4  # nothing measured: the floor
    for i in range(4):
        window.asked(f"u{i}", expires_at_ms=60_000)
    assert window.room(100) == 0
    now = 0
    for second in range(1, 11):  # the replicas answer 20 jobs a second
        for i in range(20):
            key = f"s{second}-{i}"
            window.asked(key, expires_at_ms=60_000)
            window.answered(key)
        now = second * 1000
        window.room(now)
    assert 19.0 < window.answer_rate <= 20.0 and window.window() >= 38
    assert window.room(now) == window.window() - 4  # the four never answered still count
    assert window.room(60_000) == window.window()  # until they expire
