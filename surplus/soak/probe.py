"""What one process holds, read from ``/proc`` (Linux), and what its Prometheus metrics say.

No psutil: ``/proc/PID/status`` gives the resident set (``VmRSS``) and the thread count
(``Threads``), ``/proc/PID/fd`` one entry per open file descriptor (sockets included), which
is all a leak check needs, for any process this user runs (the Java broker included).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

#: The metrics read per process, by the prefix of their names: what is summed into each measure.
LAG_METRICS = ("surplus_control_consumer_lag", "surplus_worker_kafka_lag_messages")
AGE_METRIC = "surplus_worker_targets_age_seconds"


@dataclass(frozen=True)
class Resources:
    """What a process holds at one moment."""

    rss_mib: float
    fds: int
    threads: int


def resources(pid: int) -> Resources | None:
    """RSS, open fds and threads of ``pid``; None when it is gone (or is a zombie)."""
    try:
        status = _status(pid)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    if status.get("State", "").startswith("Z") or "VmRSS" not in status:
        return None
    rss_kib = int(status["VmRSS"].split()[0])
    return Resources(rss_mib=round(rss_kib / 1024.0, 1), fds=fds,
                     threads=int(status["Threads"]))


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)


def flow(text: str) -> dict[str, float]:
    """From a /metrics text: ``consumer_lag`` (messages behind, over every partition and
    consumer the process reports) and ``targets_age_s`` (a worker's held targets; left out
    while it holds none), where the process reports them."""
    lag: float | None = None
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in LAG_METRICS and math.isfinite(sample.value):
                lag = (lag or 0.0) + sample.value
            elif sample.name == AGE_METRIC and sample.value >= 0:
                out["targets_age_s"] = round(sample.value, 3)
    if lag is not None:
        out["consumer_lag"] = lag
    return out
