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

    def due(self, now_ms: int, room: int | None = None) -> list[str]:
        """The users to send a job for now: most recently seen first, within the rate and
        at most ``room`` (the jobs the replicas can take now, `JobWindow`)."""
        if self._last_ms is not None:
            self._allowance = min(self.max_per_s,
                                  self._allowance + self.max_per_s * (now_ms - self._last_ms)
                                  / 1000.0)
        self._last_ms = now_ms
        out: list[str] = []
        for user, at in reversed(self._seen.items()):
            if (self._allowance < 1.0 or now_ms - at > self.recent_ms
                    or (room is not None and len(out) >= room)):
                break
            if now_ms - self._sent.get(user, -self.refresh_ms) < self.refresh_ms:
                continue
            self._sent[user] = now_ms
            self._allowance -= 1.0
            out.append(user)
        return out


class JobWindow:
    """How many jobs may be outstanding: what the replicas answered in the last
    ``horizon_s``, measured, never less than ``min_window``.

    Lent capacity is what it is at the moment: jobs asked past what the replicas answer only
    wait in the topic and age (an answer computed late is worth less, and one past its expiry
    is dropped unscored). So the client keeps about ``horizon_s`` of measured answers in
    flight, and the window grows as the replicas answer more, as a TCP sender's does.
    """

    def __init__(self, horizon_s: float = 2.0, min_window: int = 4,
                 rate_half_life_s: float = 5.0) -> None:
        self.horizon_s = horizon_s
        self.min_window = min_window
        self.rate_half_life_s = rate_half_life_s
        self._open: dict[str, int] = {}
        self._rate = 0.0
        self._answered_since = 0
        self._last_ms: int | None = None

    def asked(self, key: str, expires_at_ms: int) -> None:
        self._open[key] = expires_at_ms

    def answered(self, key: str) -> None:
        if self._open.pop(key, None) is not None:
            self._answered_since += 1

    def room(self, now_ms: int) -> int:
        """Jobs that may be asked for now."""
        self._measure(now_ms)
        for key in [k for k, expires in self._open.items() if expires <= now_ms]:
            del self._open[key]  # never answered: its replica was reclaimed, or it aged out
        return max(0, self.window() - len(self._open))

    def window(self) -> int:
        return max(self.min_window, int(self._rate * self.horizon_s))

    @property
    def answer_rate(self) -> float:
        """Answers a second, smoothed over ``rate_half_life_s``."""
        return self._rate

    def _measure(self, now_ms: int) -> None:
        if self._last_ms is None:
            self._last_ms = now_ms
            return
        dt = (now_ms - self._last_ms) / 1000.0
        if dt < 0.1:
            return
        keep = 0.5 ** (dt / self.rate_half_life_s)
        self._rate = keep * self._rate + (1.0 - keep) * self._answered_since / dt
        self._answered_since = 0
        self._last_ms = now_ms
