"""The fleet's processes, from `surplus.fleet.procs` (shared with `surplus chaos`)."""

from surplus.fleet.procs import (
    BASE_POOL,
    NUM_DENSE,
    NUM_SPARSE,
    POWERFUL_POOL,
    REGION,
    RMA_POOL,
    TINY_MODEL,
    ControlProc,
    WorkerProc,
    by_label,
    control_toml,
    grant,
    kafka_env,
    metric,
    scrape,
)

__all__ = ["BASE_POOL", "NUM_DENSE", "NUM_SPARSE", "POWERFUL_POOL", "REGION", "RMA_POOL",
           "TINY_MODEL", "ControlProc", "WorkerProc", "by_label", "control_toml", "grant",
           "kafka_env", "metric", "scrape"]
