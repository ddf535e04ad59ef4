"""What each request of the load is: its segment (by the segments' shares), the value it is
worth, its dense features and the candidates retrieval offers it.

Candidates are drawn once, in a bank each request takes a random run of: drawing thousands of
candidates per request in Python would cost the load generator more CPU than the extra
candidates cost the workers (the candidate ids a retrieval stage would send). The bank and
the requests come from one stream seeded from the scenario's seed, the bank first, so a
scenario's requests are the same from run to run.
"""

from __future__ import annotations

import numpy as np

from sim.scenario import RegionConfig, SegmentConfig
from workers.api import Candidate


class RequestDraws:
    """The run's requests, drawn one at a time in arrival order.

    :param region: the region's segments and candidate counts.
    :param seed: the stream of this run's request draws.
    :param num_dense: the dense features the ranking model takes.
    :param num_sparse: the sparse features of each candidate.
    """

    def __init__(self, region: RegionConfig, seed: int, *, num_dense: int,
                 num_sparse: int) -> None:
        self.region = region
        self.num_dense = num_dense
        self.num_sparse = num_sparse
        shares = np.array([s.share for s in region.segments], dtype=np.float64)
        self._cdf = np.cumsum(shares / shares.sum())
        self._rng = np.random.default_rng(seed)
        self._bank = self._candidate_bank()

    def next(self) -> tuple[SegmentConfig, float, list[float], list[Candidate]]:
        """The next request: its segment, value, dense features and candidates (its base
        ones, then as many extra as a request can carry)."""
        rng = self._rng
        seg = self.region.segments[int(np.searchsorted(self._cdf, rng.random(), side="right"))
                                   if len(self._cdf) > 1 else 0]
        value = max(0.0, float(rng.normal(seg.value, seg.value_noise)))
        dense = rng.standard_normal(self.num_dense).round(4).tolist()
        n = self.region.base_candidates + self.region.max_extra_candidates
        start = int(rng.integers(0, len(self._bank) - n + 1))
        return seg, value, dense, self._bank[start:start + n]

    def _candidate_bank(self) -> list[Candidate]:
        n = 2 * (self.region.base_candidates + self.region.max_extra_candidates)
        sparse = self._rng.integers(0, 2**31 - 1, size=(n, self.num_sparse)).tolist()
        priors = self._rng.random(n).round(4).tolist()
        return [Candidate(id=j, sparse=sparse[j], prior=priors[j]) for j in range(n)]
