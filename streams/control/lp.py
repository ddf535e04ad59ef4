"""The allocator's linear programme, solved by HiGHS through its own Python binding (highspy).

``scipy.optimize.linprog(method="highs")`` runs the same solver but spends about 1 ms of
Python a call checking options and converting arrays around a much shorter solve. The
allocator solves once a scope and period, live, in every replay and in every simulated
period: through linprog that was a tenth of an offline replay's CPU. Here the model is passed
as HiGHS holds it and each scope's controller keeps its solver: 0.45 ms a solve against 1.6
(docs/benchmarks.md).

The options are the ones ``linprog`` sets (dual simplex, presolve on). With the HiGHS version
scipy bundles (requirements.lock pins highspy to it), the answers are linprog's, bit for bit,
degenerate programmes included: ``tests/unit/control/test_lp.py`` checks a few hundred.
"""

from __future__ import annotations

import highspy
import numpy as np


class Solver:
    """One HiGHS instance, set as ``linprog`` sets it, for one caller at a time (a scope's
    controller keeps one: creating it costs about as much as a solve)."""

    def __init__(self) -> None:
        self._highs = highspy.Highs()
        self._highs.setOptionValue("output_flag", False)
        self._highs.setOptionValue("presolve", "on")
        self._highs.setOptionValue("simplex_strategy", 1)  # dual, as linprog's "highs"

    def minimise(self, cost: np.ndarray, a_ub: np.ndarray, b_ub: np.ndarray, a_eq: np.ndarray,
                 b_eq: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray | None:
        """``x`` minimising ``cost @ x`` subject to ``a_ub @ x <= b_ub``, ``a_eq @ x == b_eq``
        and ``lower <= x <= upper`` (dense arrays), or None when HiGHS finds no optimum."""
        a = np.vstack([a_ub, a_eq])
        cols, rows = np.nonzero(a.T)  # column by column, rows ascending in each
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
        lp.col_cost_ = np.asarray(cost, dtype=float)
        lp.col_lower_ = np.asarray(lower, dtype=float)
        lp.col_upper_ = np.asarray(upper, dtype=float)
        lp.row_lower_ = np.concatenate([np.full(len(b_ub), -highspy.kHighsInf), b_eq])
        lp.row_upper_ = np.concatenate([b_ub, b_eq])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.searchsorted(cols, np.arange(a.shape[1] + 1)).astype(np.int32)
        lp.a_matrix_.index_ = rows.astype(np.int32)
        lp.a_matrix_.value_ = a.T[cols, rows]
        highs = self._highs
        highs.clearModel()
        highs.passModel(lp)
        highs.run()
        if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        return np.array(highs.getSolution().col_value)
