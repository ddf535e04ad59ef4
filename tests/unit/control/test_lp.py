"""The allocator's LP through highspy gives scipy's ``linprog`` answers, bit for bit.

The simulator's goldens and every replay were made with ``linprog(method="highs")``; the
binding was swapped for speed (see ``streams.control.lp``), so the answers must not move, on
degenerate programmes (ties between levers, several optima) as much as on clean ones.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from streams.control.lp import Solver


def _programme(seed: int, types: int, rma: int, sbm: int, ties: bool) -> tuple[np.ndarray, ...]:
    """An allocator-shaped programme: per-type RMA and SBM units, their value segments, the
    CPU row and the levers' caps (``allocator.allocate``'s layout), drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    n, size = types, 2 * types + rma + sbm
    values = rng.choice([1.0, 2.0, 3.0], rma + sbm) if ties else rng.uniform(0.1, 5.0, rma + sbm)
    cost = np.zeros(size)
    cost[:2 * n] = 1e-7
    cost[2 * n:2 * n + rma] = -np.sort(values[:rma])[::-1]
    cost[2 * n + rma:] = -np.sort(values[rma:])[::-1]
    a_ub = np.zeros((n + 3, size))
    for i in range(n):
        a_ub[i, i] = a_ub[i, n + i] = 1.0
    speeds = rng.choice([0.5, 1.0, 2.0], 2 * n)
    a_ub[n, :n] = 4.0 * speeds[:n]
    a_ub[n + 1, :n] = speeds[:n]
    a_ub[n + 2, n:2 * n] = speeds[n:]
    b_ub = np.concatenate([rng.uniform(0.0, 16.0, n), [rng.uniform(0.0, 64.0)],
                           rng.choice([1e18, 4.0, 0.0], 2)])
    a_eq = np.zeros((2, size))
    a_eq[0, :n], a_eq[0, 2 * n:2 * n + rma] = speeds[:n], -1.0
    a_eq[1, n:2 * n], a_eq[1, 2 * n + rma:] = speeds[n:], -1.0
    upper = rng.choice([0.0, 2.0, 8.0], size)
    return cost, a_ub, b_ub, a_eq, np.zeros(2), np.zeros(size), upper


SOLVER = Solver()
"""One solver for every programme, as a controller keeps one: no answer depends on the last."""


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), types=st.integers(1, 3), rma=st.integers(1, 4),
       sbm=st.integers(1, 4), ties=st.booleans())
def test_highspy_answers_are_linprogs_bit_for_bit(seed: int, types: int, rma: int, sbm: int,
                                                  ties: bool) -> None:
    cost, a_ub, b_ub, a_eq, b_eq, lower, upper = _programme(seed, types, rma, sbm, ties)
    mine = SOLVER.minimise(cost, a_ub, b_ub, a_eq, b_eq, lower, upper)
    theirs = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq,
                     bounds=list(zip(lower, upper, strict=True)), method="highs")
    assert theirs.status == 0 and mine is not None
    assert mine.tolist() == theirs.x.tolist()


def test_an_infeasible_programme_has_no_answer() -> None:
    one = np.ones((1, 1))
    assert Solver().minimise(np.ones(1), one, np.array([-1.0]), np.zeros((0, 1)),
                             np.zeros(0), np.zeros(1), np.ones(1)) is None
