"""The surge rule: optional work yields to a baseline burst shorter than a control period.

The control loop sees a burst only at its next period; a replica sees it within
milliseconds. While the baseline rate of the recent window is over ``surge_ratio`` times the
settled one (and the recent window saw at least ``surge_min_items`` baseline items: fewer
are chance, not a burst), new optional work is admitted only while the recent offered load,
baseline included, stays under the settled load the control loop has been running
(``surge_load_factor``), or under ``surge_floor_share`` of the replica's throughput; queued
optional work is shed, lowest value first, until it does. Pure: the caller passes the time,
and the offered load and service model it owns.
"""

from __future__ import annotations

from workers.policy.admission_config import AdmissionConfig
from workers.policy.load_meter import LoadMeter


class SurgeRule:
    """The surge test and ceiling over one worker's offered load (``LoadMeter``)."""

    def __init__(self, config: AdmissionConfig, load: LoadMeter) -> None:
        """:param config: the ``surge_*`` bounds.
        :param load: the worker's offered load, which admission feeds.
        """
        self.config = config
        self.load = load

    def surging(self, now_ms: int) -> bool:
        """Whether the baseline rate of the recent window is over ``surge_ratio`` times the
        settled one (a burst the control loop has not seen yet)."""
        load = self.load
        load.advance(now_ms)
        cfg = self.config
        return load.recent_items >= cfg.surge_min_items and load.rate(
            0, optional=False) > cfg.surge_ratio * load.rate(1, optional=False)

    def ceiling(self, per_unit_ms: float) -> float:
        """Offered load (units per ms) a surge may reach with optional work in it, on a
        replica that serves a unit in ``per_unit_ms``."""
        cfg = self.config
        floor = cfg.surge_floor_share / max(per_unit_ms, 1e-12)
        return max(cfg.surge_load_factor * self.load.rate(1), floor)

    def refuses(self, units: int, now_ms: int, per_unit_ms: float) -> bool:
        """Whether ``units`` more optional units now would take a surge past its ceiling."""
        load = self.load
        return self.surging(now_ms) and (load.rate(0) + units / max(load.norm[0], 1.0)
                                         > self.ceiling(per_unit_ms))
