"""Faults on the network between the load's client and one worker, through the worker's
toxiproxy proxy: answers delayed, or the connection cut; healed by clearing the proxy."""

from __future__ import annotations

from collections.abc import Callable

from surplus.chaos.schedule import Fault
from surplus.fleet.toxiproxy import Toxiproxy


class NetworkFaults:
    """The network faults of one run; each method injects one, holds it and heals it.

    :param proxies: the toxiproxy in front of each worker, proxies named by worker.
    :param hold: waits out a fault's hold (shorter when the run stops).
    """

    def __init__(self, proxies: Toxiproxy, hold: Callable[[Fault], None]) -> None:
        self.toxi = proxies
        self._hold = hold

    def net_delay(self, fault: Fault) -> str:
        ms = int(fault.param)  # toxiproxy takes whole milliseconds only
        self.toxi.add_toxic(fault.target, "latency_down", "latency", "downstream",
                            latency=ms, jitter=ms // 4)
        try:
            self._hold(fault)
        finally:
            self.toxi.clear(fault.target)
        return ""

    def net_cut(self, fault: Fault) -> str:
        self.toxi.set_enabled(fault.target, False)
        try:
            self._hold(fault)
        finally:
            self.toxi.clear(fault.target)
        return ""
