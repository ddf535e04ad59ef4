"""The garbage collector's pauses: measured in every process, and kept short in serving ones.

CPython's full (generation 2) collection walks every tracked object, and it holds the GIL while
it does. A process that has imported torch, aiohttp and the Kafka clients holds some 200,000 of
them, so each full collection stops the event loop, the inference thread and the Kafka thread
alike for about 100 ms on a 2-core machine: a baseline request that arrives then waits out the
whole SLA, and a preemption notice waits with it.

Almost all of those objects are modules, classes and functions made at start-up and kept for the
process's life. ``freeze_startup_heap`` moves them to the permanent generation once start-up is
done (model loaded, clients built), so later collections walk only what serving made. The
pauses themselves are observed as ``surplus_gc_pause_seconds`` by generation, so this is a
measured claim on every /metrics, not a hope.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.registry import Collector

PAUSE_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)

_PAUSES = Histogram("surplus_gc_pause_seconds",
                    "Garbage-collector pauses of this process (the GIL is held throughout)",
                    ["generation"], buckets=PAUSE_BUCKETS_S, registry=None)
#: perf_counter at the running collection's start: CPython runs one collection at a time in a
#: process, whichever thread triggers it, so one slot is enough.
_started: list[float] = []
_install_lock = threading.Lock()
_installed = False


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    """gc.callbacks hook: runs in whichever thread triggered the collection."""
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        _PAUSES.labels(str(info.get("generation", "?"))).observe(
            time.perf_counter() - _started.pop())


class _PauseCollector(Collector):
    def collect(self) -> Iterator[Any]:
        yield from _PAUSES.collect()


def observe_pauses(registry: CollectorRegistry) -> None:
    """Expose this process's collector pauses in ``registry`` (the hook is installed once per
    process, however many registries ask, e.g. several workers in one test process)."""
    global _installed
    with _install_lock:
        if not _installed:
            gc.callbacks.append(_on_gc)
            _installed = True
    registry.register(_PauseCollector())


def freeze_startup_heap() -> int:
    """Collect once, then exempt every surviving object from later collections (see the module
    docstring). Call it when start-up is done; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
