"""The load's requests are a function of the scenario's seed, and its labels are lost, sent
once or twice as the scenario's ``[labels]`` says."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from sim.scenario import LabelsPlant
from surplus.live import plan
from surplus.live.draws import RequestDraws
from surplus.live.labels import Labels


def _draws(seed: int) -> list[tuple[str, float, list[int]]]:
    region = plan.load("demo", 30.0)[0].regions[0]
    draws = RequestDraws(region, seed, num_dense=4, num_sparse=2)
    out = []
    for _ in range(20):
        seg, value, _dense, candidates = draws.next()
        assert len(candidates) == region.base_candidates + region.max_extra_candidates
        out.append((seg.name, value, [c.id for c in candidates[:3]]))
    return out


def test_the_same_seed_draws_the_same_requests() -> None:
    assert _draws(5) == _draws(5)
    assert _draws(5) != _draws(6)


class _Client:
    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []

    def label(self, request_id: str, value: float) -> None:
        self.sent.append((request_id, value))


async def _labels(plant: LabelsPlant) -> tuple[Labels, _Client]:
    client = _Client()
    labels = Labels(plant, 3, cast(Any, client))
    for i in range(10):
        labels.later(f"r{i}", float(i))
    await asyncio.sleep(0.05)
    return labels, client


async def test_lost_labels_are_counted_and_never_sent() -> None:
    labels, client = await _labels(LabelsPlant(lost=1.0))
    assert (labels.lost, labels.sent, labels.due, client.sent) == (10, 0, 0, [])


async def test_duplicated_labels_come_twice_and_late_ones_stay_due() -> None:
    labels, client = await _labels(LabelsPlant(lost=0.0, duplicated=1.0, delay_median_s=0.001,
                                               delay_sigma=0.0))
    assert (labels.lost, labels.sent, labels.due) == (0, 20, 0)
    assert sorted(client.sent) == sorted([(f"r{i}", float(i)) for i in range(10)] * 2)
    late, _ = await _labels(LabelsPlant(lost=0.0, duplicated=0.0, delay_median_s=60.0,
                                            delay_sigma=0.0))
    assert (late.sent, late.due) == (0, 10)
