"""Independent runs, several at a time (``sim.pool.each``): every call's result under its key,
whether the calls run here or in processes of their own."""

from __future__ import annotations

import operator

from sim.pool import each


def test_one_job_runs_every_call_here_in_order() -> None:
    seen: list[int] = []

    def note(x: int) -> int:   # a closure: only this process could run it
        seen.append(x)
        return x * 10

    got = list(each({"a": (note, (1,)), "b": (note, (2,))}, jobs=1))
    assert got == [("a", 10), ("b", 20)] and seen == [1, 2]


def test_several_jobs_give_each_key_its_own_result() -> None:
    calls = {n: (operator.mul, (n, n)) for n in range(4)}
    assert dict(each(calls, jobs=2)) == {0: 0, 1: 1, 2: 4, 3: 9}


def test_nothing_to_run_yields_nothing() -> None:
    assert list(each({}, jobs=4)) == []
