"""What a client holds of the precompute lever's answers, and which users to ask it for.

`Answers` keeps the latest answer per job key (the cache topic is compacted: a key read twice,
from two replicas or a redelivered job, is one answer) in bounded memory, and says whether a
request can use one: the same scope, not expired. `JobPlanner` picks the users to send jobs
for: those seen recently (a user who came lately is likely to come again soon) whose answer is
missing or old, no user twice within its refresh, at most a rate. Both are plain state, fed
times by the caller, so the load generator and the simulator use them alike.
"""

from __future__ import annotations

from collections import OrderedDict

from schemas.precompute import PrecomputeResult


class Answers:
    """The latest answer per job key, the oldest dropped past ``capacity``."""

    def __init__(self, scope: str, capacity: int = 100_000) -> None:
        self.scope = scope
        self.capacity = capacity
        self._by_key: OrderedDict[str, PrecomputeResult] = OrderedDict()
        self.counts: dict[str, int] = {}

    def add(self, result: PrecomputeResult) -> None:
        if result.scope != self.scope:
            self._bump("other_scope")
            return
        held = self._by_key.get(result.job_key)
        if held is not None and held.issued_at_ms > result.issued_at_ms:
            self._bump("older")  # an answer to an earlier job, read after a newer one
            return
        self._bump("duplicate" if held is not None and held.issued_at_ms == result.issued_at_ms
                   else "received")
        self._by_key[result.job_key] = result
        self._by_key.move_to_end(result.job_key)
        while len(self._by_key) > self.capacity:
            self._by_key.popitem(last=False)

    def fresh(self, key: str, now_ms: int) -> PrecomputeResult | None:
        """The answer a request of ``key`` may use at ``now_ms``, counted as a hit or miss."""
        result = self._by_key.get(key)
        if result is None:
            self._bump("miss")
            return None
        if result.expires_at_ms <= now_ms:
            self._bump("expired")
            return None
        self._bump("hit")
        return result

    def __len__(self) -> int:
        return len(self._by_key)

    def _bump(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


class JobPlanner:
    """Which users to send precompute jobs for; see the module docstring.

    :param recent_ms: a user seen within this long is likely to come again.
    :param refresh_ms: no user gets a second job within this long of its last.
    :param max_per_s: jobs a second at most (the lever's rate).
    """

    def __init__(self, recent_ms: int, refresh_ms: int, max_per_s: float,
                 memory: int = 100_000) -> None:
        self.recent_ms = recent_ms
        self.refresh_ms = refresh_ms
        self.max_per_s = max_per_s
        self.memory = memory
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._sent: dict[str, int] = {}
        self._allowance = 0.0
        self._last_ms: int | None = None

    def seen(self, user: str, now_ms: int) -> None:
        self._seen[user] = now_ms
        self._seen.move_to_end(user)
        while len(self._seen) > self.memory:
            gone, _ = self._seen.popitem(last=False)
            self._sent.pop(gone, None)

    def due(self, now_ms: int) -> list[str]:
        """The users to send a job for now: most recently seen first, within the rate."""
        if self._last_ms is not None:
            self._allowance = min(self.max_per_s,
                                  self._allowance + self.max_per_s * (now_ms - self._last_ms)
                                  / 1000.0)
        self._last_ms = now_ms
        out: list[str] = []
        for user, at in reversed(self._seen.items()):
            if self._allowance < 1.0 or now_ms - at > self.recent_ms:
                break
            if now_ms - self._sent.get(user, -self.refresh_ms) < self.refresh_ms:
                continue
            self._sent[user] = now_ms
            self._allowance -= 1.0
            out.append(user)
        return out
