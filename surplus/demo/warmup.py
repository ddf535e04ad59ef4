"""Warm a fresh worker up before it takes traffic: a few baseline-only requests of every size.

The first forward passes of a new process allocate and pick kernels; a fleet does not put a
replica in rotation before that has happened. Baseline-only (``base_count`` = every
candidate), so no optional work is done or shed, and it happens before the load phase, whose
windows are the only ones judged.
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np

from workers.api import RANK_PATH, Candidate, RankRequest, encode


def warm_up(url: str, max_candidates: int, rounds: int = 3, seed: int = 0) -> int:
    """Send ``rounds`` requests of 1..max_candidates candidates (doubling); returns how many."""
    with urllib.request.urlopen(f"{url}/healthz", timeout=5.0) as resp:
        shape = json.loads(resp.read())
    dense_n, sparse_n = int(shape["num_dense"]), int(shape["num_sparse"])
    rng = np.random.default_rng(seed)
    sizes = []
    n = 1
    while n < max_candidates:
        sizes.append(n)
        n *= 2
    sizes.append(max_candidates)
    sent = 0
    for _ in range(rounds):
        for size in sizes:
            sparse = rng.integers(0, 2**31 - 1, size=(size, sparse_n)).tolist()
            request = RankRequest(
                request_id=f"warm-up-{sent}", segment="warm-up", value=0.0, deadline_ms=1000.0,
                dense=rng.standard_normal(dense_n).tolist(), base_count=size,
                candidates=[Candidate(id=j, sparse=sparse[j]) for j in range(size)])
            req = urllib.request.Request(f"{url}{RANK_PATH}", data=encode(request),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=10.0) as resp:
                resp.read()
            sent += 1
    return sent
