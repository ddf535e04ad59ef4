"""The history a chaos run leaves for its checker: the run's settings, then every request and
targets offer the load saw and every record of the nemesis, all on the schedule's clock.

The load keeps its own monotonic clock from its start, and the fleet's warm-up takes a
different time each run; shifted by the time the schedule started (``t0``), a history reads
as the schedule does, so a violation's window is the window to replay. Requests from before
the schedule started (the warm-up) are left out.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from streams.control.config import RmaConfig
from surplus.chaos import history as h
from surplus.chaos.config import ChaosConfig
from surplus.chaos.recorder import Recorder
from surplus.fleet.records import Request, TargetOffer
from workers.policy.targets import LocalLimits

#: Age past its TTL a target may have when used (`RunInfo.ttl_slack_ms`).
TTL_SLACK_MS = 1000
#: The fields of a record that are load times, shifted to the schedule's clock.
TIMES = ("t", "end_t", "deadline_t", "acked_t", "direct_t")


def run_info(seed: int, duration_s: float, cfg: ChaosConfig) -> h.RunInfo:
    """The settings the checker judges the run by (the SLA: the configured one, else RMA's
    default)."""
    sla = cfg.sla_p99_ms if cfg.sla_p99_ms is not None else RmaConfig().sla_p99_ms
    return h.RunInfo(seed=seed, duration_s=duration_s, sla_p99_ms=sla,
                     window_s=cfg.window_s, ttl_ms=int(cfg.ttl_s * 1000),
                     max_clock_skew_ms=LocalLimits().max_clock_skew_ms,
                     ttl_slack_ms=TTL_SLACK_MS,
                     settle_s=cfg.settle_s, startup_s=cfg.schedule.warmup_s)


def shifted(record: h.Record, shift: float) -> h.Record:
    """``record`` with each of its load times (and a label total's times) less ``shift``."""
    changes = {name: round(getattr(record, name) - shift, 3)
               for name in TIMES if getattr(record, name, None) is not None}
    if isinstance(record, h.LabelTotals):
        changes["times"] = [round(x - shift, 3) for x in record.times]
    return msgspec.structs.replace(record, **changes)


def history(run: h.RunInfo, samples: Iterable[Request], offers: Iterable[TargetOffer],
            recorder: Recorder, shift: float) -> list[h.Record]:
    """The run's history: ``run`` first, then the requests from ``shift`` on, the offers and
    the nemesis's records, every time less ``shift``."""
    out: list[h.Record] = [run]
    for s in samples:
        if s.t < shift:
            continue
        out.append(msgspec.structs.replace(
            s, t=round(s.t - shift, 4), end_t=round(s.end_t - shift, 4),
            latency_ms=round(s.latency_ms, 2)))
    out += [msgspec.structs.replace(o, t=round(o.t - shift, 4)) for o in offers]
    with recorder.lock:
        out += [shifted(r, shift) if hasattr(r, "t") or isinstance(r, h.LabelTotals) else r
                for r in recorder.records]
    return out
