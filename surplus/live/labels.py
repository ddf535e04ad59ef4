"""Outcome labels as a ranking service sends them: the value it observed for a served request
reaches it late, as a click or a conversion does, after a log-normal delay
(``LabelsPlant.fate``, the simulator's rule); some never, some twice.

The draws come from a stream of their own, seeded from the scenario's seed, so a run's
requests are the same whatever becomes of their labels.
"""

from __future__ import annotations

import asyncio

import numpy as np

from sim.scenario import LabelsPlant
from workers.client.client import RankingClient


class Labels:
    """Labels sent later through the run's client, and their counts.

    :param plant: the scenario's ``[labels]``: the delay, the share lost and duplicated.
    :param seed: the stream of this run's label draws.
    :param client: the run's client (``RankingClient.label``).
    """

    def __init__(self, plant: LabelsPlant, seed: int,
                 client: RankingClient) -> None:
        self.plant = plant
        self._rng = np.random.default_rng(seed)
        self.client = client
        self.sent = 0
        self.lost = 0
        self.due = 0
        """Labels scheduled and not yet sent (the run may end before they are due)."""

    def later(self, request_id: str, value: float) -> None:
        """The outcome reaches the service after a log-normal delay; some never, some twice."""
        lost, z, dup = self._rng.random(), self._rng.standard_normal(), self._rng.random()
        fate = self.plant.fate(lost, float(z), dup)
        if fate is None:
            self.lost += 1
            return
        delay, twice = fate
        loop = asyncio.get_running_loop()
        for at in ((delay, 2 * delay) if twice else (delay,)):
            loop.call_later(at, self._send, request_id, value)
            self.due += 1

    def _send(self, request_id: str, value: float) -> None:
        self.due -= 1
        self.sent += 1
        self.client.label(request_id, value)
