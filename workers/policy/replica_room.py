"""How many extra candidates one replica has room for: the client sizes a request's extras to
the replica it is about to go to, so that it does not send what that replica would trim.

RMA's target is one number for the whole scope, held by the control plane to the most extras a
request could keep on any replica (``WindowReport.extras_room``). Replica sets differ: a
provisioned set of two drains twice the extras of a lent set of one within the same queue
bound, so at the scope's target the smaller set trims about half of what it is sent, every
request, as ``overload`` (`diurnal_day_tight`, docs/benchmarks.md). That is the worker's fast
layer doing the steady work of sizing, which is the client's.

Each response says how many optional units would fit under that replica's delay bound now
(``ServerState.optional_room``). The client keeps, per replica, the most it said over the last
control period and the one under way (the periods end as period targets arrive, the same
period the control plane judges room over), and sends at most that. A replica it heard
nothing from in the last period is not capped: the worker's admission still trims what does
not fit, as it does for a surprise. The cap is the most the replica had room for over a whole
period, not its room at one moment, so a request is never cut below what that replica
recently kept.
"""

from __future__ import annotations


class ReplicaRooms:
    """Per replica, the most optional room it reported this period and the last one."""

    def __init__(self) -> None:
        self._current: dict[str, int] = {}
        self._last: dict[str, int] = {}

    def observe(self, replica: str, room: int | None) -> None:
        """``replica`` answered, with room for ``room`` optional units (None: it did not say,
        as an older worker or a replica serving whole requests)."""
        if room is None:
            return
        if room > self._current.get(replica, -1):
            self._current[replica] = room

    def new_period(self) -> None:
        """A control period ended: this period's rooms become the last period's."""
        self._last, self._current = self._current, {}

    def cap(self, replica: str) -> int | None:
        """The most extras to send ``replica`` (None: no cap, nothing heard last period)."""
        last = self._last.get(replica)
        if last is None:
            return None
        return max(last, self._current.get(replica, 0))

    def fit(self, replica: str, extra: int) -> int:
        """How many of a request's ``extra`` candidates to send ``replica``."""
        cap = self.cap(replica)
        return extra if cap is None else min(extra, cap)
