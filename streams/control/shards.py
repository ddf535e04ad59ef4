"""The first stage of a scaled-out scope: one shard's reports, summed per control period.

One scope is one partition when its telemetry is keyed by scope, so one process reads all of
a region's reports however many there are. Keyed by replica instead, a region's reports spread
over every partition; the process owning each partition sums what it reads into one
``WindowPartial`` per scope and period (``ShardWindows``), and the scope's owner merges the
parts (``streams.control.gate``) into the window its controller closes. Every sum in a window
merges by addition or by max (``LatencyWindow.add_partial``), so the merged window is the one a
single reader would have built, up to the order of float additions.

A report belongs to the period its arrival falls in: the period ending at the first multiple
of the scope's period at or after it (the offline driver's rule), or the one after the last
period already sent, if that one has gone (a late report, as the single reader adds it to the
open window). A shard speaks for every period of a scope it has read from lately, with an
empty part when it read nothing, so the second stage knows when it has every part: it keeps
speaking for ``SHARD_MEMORY_PERIODS`` periods after its last report of the scope, and the
second stage expects it for exactly as long.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from schemas.contract import WindowPartial, WindowReport
from streams.control.dispatch import KEY_MISMATCH, REFUSALS, Rejected, refused
from streams.control.windows import WindowSet

#: Periods a shard keeps sending empty parts for a scope after its last report of it, and the
#: second stage keeps expecting them: long enough to ride over a replica's restart, short
#: enough that a shard whose replicas have all left stops being waited for.
SHARD_MEMORY_PERIODS = 6

PeriodOf = Callable[[str], int]
"""A scope's control period in ms (``ControlConfig.for_scope(scope).period_ms``)."""


def period_end(at_ms: int, period_ms: int) -> int:
    """The end of the period ``at_ms`` falls in: an event at or before a tick belongs to the
    period that tick closes."""
    return -(-at_ms // period_ms) * period_ms


class _ScopeShard:
    """One scope's open periods on one shard, and how long it has been silent."""

    __slots__ = ("last_reported", "last_sent", "open", "period_ms")

    def __init__(self, period_ms: int) -> None:
        self.period_ms = period_ms
        self.open: dict[int, WindowSet] = {}
        self.last_sent: int | None = None
        self.last_reported = 0

    def quiet_after(self) -> int:
        """The last period this shard speaks for unless it reads from the scope again."""
        return self.last_reported + SHARD_MEMORY_PERIODS * self.period_ms


class ShardWindows:
    """One shard's reports per scope and period; ``due`` hands over the periods that ended."""

    def __init__(self, shard: str, period_of: PeriodOf, *, min_samples: int,
                 relative_accuracy: float, max_pools: int) -> None:
        """:param shard: who speaks (the input partition; a new owner speaks for it on).
        :param period_of: each scope's control period, as its controller runs it.
        """
        self.shard = shard
        self._period_of = period_of
        self._min_samples = min_samples
        self._accuracy = relative_accuracy
        self._max_pools = max_pools
        self._scopes: dict[str, _ScopeShard] = {}

    def add(self, report: WindowReport, at_ms: int) -> None:
        """Sum one report into its scope's period. Raises what the controller's own window
        raises (``SketchMismatch``, ``TooManyPools``) before summing anything, so the caller
        refuses the message where it was read."""
        scope = self._scopes.get(report.region)
        if scope is None:
            scope = self._scopes[report.region] = _ScopeShard(self._period_of(report.region))
        end = period_end(at_ms, scope.period_ms)
        if scope.last_sent is not None and end <= scope.last_sent:
            end = scope.last_sent + scope.period_ms
        windows = scope.open.get(end)
        if windows is None:
            windows = scope.open[end] = WindowSet(self._min_samples, self._accuracy,
                                                  max_pools=self._max_pools)
        windows.add(report)
        scope.last_reported = max(end, scope.last_reported)

    def take(self, key: str | None, reports: Sequence[WindowReport], at_ms: int) -> None:
        """One telemetry message: refused whole (``Rejected``) if a key lies, as the rulebook
        refuses one, else each report summed in turn (a refusal stops at that report).

        A report's key may be its replica (what spreads a region over the partitions) or its
        scope (what a worker not yet told to spread writes)."""
        for report in reports:
            if key != report.worker_id and key != report.region:
                raise Rejected(KEY_MISMATCH, f"message key {key!r} is neither the replica "
                                             f"{report.worker_id!r} nor the scope "
                                             f"{report.region!r}")
        try:
            for report in reports:
                self.add(report, at_ms)
        except REFUSALS as exc:
            raise refused(exc) from exc

    def due(self, now_ms: int) -> list[WindowPartial]:
        """The parts of every period that has ended by ``now_ms``, in order of scope and
        period: the sums read, or empty while the scope was read from lately."""
        parts: list[WindowPartial] = []
        for region in sorted(self._scopes):
            scope = self._scopes[region]
            parts.extend(self._due(region, scope, now_ms))
            if not scope.open and scope.last_sent is not None \
                    and scope.last_sent >= scope.quiet_after():
                del self._scopes[region]  # silent for long enough: no longer expected
        return parts

    def _due(self, region: str, scope: _ScopeShard, now_ms: int) -> list[WindowPartial]:
        period = scope.period_ms
        last = period_end(now_ms, period)
        if last > now_ms:
            last -= period  # the period ``now_ms`` falls in is still open
        first = min(scope.open, default=last + period)
        if scope.last_sent is not None:
            first = min(first, scope.last_sent + period)
        parts = []
        for end in range(first, last + 1, period):
            windows = scope.open.pop(end, None)
            if windows is None and end > scope.quiet_after():
                break
            pools = [] if windows is None else windows.partials()
            parts.append(WindowPartial(region=region, shard=self.shard, period_end_ms=end,
                                       pools=pools))
            scope.last_sent = end
        return parts

    def __len__(self) -> int:
        """Scopes this shard speaks for."""
        return len(self._scopes)
