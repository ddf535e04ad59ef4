"""The pure control core: PID, latency windows, pool inventory, lever allocator, RMA and SBM
policies, and the ScopeController that ties them together.

Nothing here imports Kafka, Faust, torch or an HTTP library, and nothing reads a clock: time
comes in as ``now_ms``. That is what lets the live agents, the offline replayer and the
simulator run the exact same code.
"""

from streams.control.allocator import Allocation, allocate
from streams.control.config import (
    AllocatorConfig,
    ConfigError,
    ControlConfig,
    RmaConfig,
    SbmConfig,
    load_config,
    with_overrides,
)
from streams.control.controller import (
    ControllerState,
    ScopeController,
    ScopeMismatch,
    decode_state,
    encode_state,
)
from streams.control.inventory import CapacityVector, PoolInventory
from streams.control.pid import Pid, PidConfig, PidState
from streams.control.rma import RmaPolicy, rma_budget
from streams.control.sbm import SbmPolicy, SegmentEstimator
from streams.control.windows import LatencyWindow, TooManyPools, WindowSet, WindowStats

__all__ = [
    "Allocation", "AllocatorConfig", "CapacityVector", "ConfigError", "ControlConfig",
    "ControllerState", "LatencyWindow", "Pid", "PidConfig", "PidState", "PoolInventory",
    "RmaConfig", "RmaPolicy", "SbmConfig", "SbmPolicy", "ScopeController", "ScopeMismatch",
    "SegmentEstimator", "TooManyPools", "WindowSet", "WindowStats", "allocate", "decode_state",
    "encode_state", "load_config", "rma_budget", "with_overrides",
]
