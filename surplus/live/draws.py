"""What each request of the load is: its segment (by the segments' shares), the value it is
worth, its dense features and the candidates retrieval offers it.

Candidates are drawn once, in a bank each request takes a random run of: drawing thousands of
candidates per request in Python would cost the load generator more CPU than the extra
candidates cost the workers (the candidate ids a retrieval stage would send). The bank and
the requests come from one stream seeded from the scenario's seed, the bank first, so a
scenario's requests are the same from run to run.

With the precompute lever on (`sim.scenario.PrecomputePlant`), requests come from users who
return: each user keeps a segment, dense features and a run of the bank between visits, and
visits follow a Zipf law, so a job scored for a user ahead of a visit ranks what the visit
ranks (`job` draws nothing: it is the user's own run, longer by the job's candidates).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scenario import PrecomputePlant, RegionConfig, SegmentConfig
from workers.api import Candidate


@dataclass(frozen=True)
class Users:
    """The returning users: each one's segment, dense features and start in the bank."""

    cdf: np.ndarray
    segments: np.ndarray
    dense: np.ndarray
    starts: np.ndarray


class RequestDraws:
    """The run's requests, drawn one at a time in arrival order.

    :param region: the region's segments and candidate counts.
    :param seed: the stream of this run's request draws.
    :param num_dense: the dense features the ranking model takes.
    :param num_sparse: the sparse features of each candidate.
    """

    def __init__(self, region: RegionConfig, seed: int, *, num_dense: int,
                 num_sparse: int, precompute: PrecomputePlant | None = None) -> None:
        self.region = region
        self.num_dense = num_dense
        self.num_sparse = num_sparse
        self.precompute = precompute if precompute is not None and precompute.enabled else None
        shares = np.array([s.share for s in region.segments], dtype=np.float64)
        self._cdf = np.cumsum(shares / shares.sum())
        self._rng = np.random.default_rng(seed)
        self._run = region.base_candidates + max(
            region.max_extra_candidates, self.precompute.candidates if self.precompute else 0)
        self._bank = self._candidate_bank()
        self._users = self._draw_users() if self.precompute is not None else None
        #: The user of the request drawn last (None without the precompute lever).
        self.user: str | None = None

    def next(self) -> tuple[SegmentConfig, float, list[float], list[Candidate]]:
        """The next request: its segment, value, dense features and candidates (its base
        ones, then as many extra as a request can carry); its user in `user`."""
        rng = self._rng
        n = self.region.base_candidates + self.region.max_extra_candidates
        if self._users is not None:
            u = int(np.searchsorted(self._users.cdf, rng.random(), side="right"))
            self.user = f"u{u}"
            seg, dense, candidates = self._user(u, n)
        else:
            seg = self.region.segments[self._segment(rng.random())]
            dense = rng.standard_normal(self.num_dense).round(4).tolist()
            start = int(rng.integers(0, len(self._bank) - n + 1))
            candidates = self._bank[start:start + n]
        value = max(0.0, float(rng.normal(seg.value, seg.value_noise)))
        return seg, value, dense, candidates

    def job(self, user: str) -> tuple[SegmentConfig, list[float], list[Candidate]]:
        """What a precompute job for ``user`` scores: its segment, dense features, and its
        run of candidates with the job's extras (the same run its visits take the head of)."""
        assert self.precompute is not None, "no precompute lever in this scenario"
        return self._user(int(user[1:]), self.region.base_candidates
                          + self.precompute.candidates)

    def _user(self, u: int, n: int) -> tuple[SegmentConfig, list[float], list[Candidate]]:
        users = self._users
        assert users is not None
        start = int(users.starts[u])
        return (self.region.segments[int(users.segments[u])], users.dense[u].tolist(),
                self._bank[start:start + n])

    def _segment(self, draw: float) -> int:
        return int(np.searchsorted(self._cdf, draw, side="right")) if len(self._cdf) > 1 else 0

    def _draw_users(self) -> Users:
        plant = self.precompute
        assert plant is not None
        rng = self._rng
        return Users(cdf=plant.visit_cdf(),
                     segments=np.searchsorted(self._cdf, rng.random(plant.users), side="right")
                     .clip(0, len(self.region.segments) - 1),
                     dense=rng.standard_normal((plant.users, self.num_dense)).round(4),
                     starts=rng.integers(0, len(self._bank) - self._run + 1, size=plant.users))

    def _candidate_bank(self) -> list[Candidate]:
        n = 2 * self._run
        sparse = self._rng.integers(0, 2**31 - 1, size=(n, self.num_sparse)).tolist()
        priors = self._rng.random(n).round(4).tolist()
        return [Candidate(id=j, sparse=sparse[j], prior=priors[j]) for j in range(n)]
