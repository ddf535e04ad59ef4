"""The clients' decision sample in the simulator: records and labels of the requests the
request-id hash leaves out are not published (``[client] decision_sample``).

A live client applies the rule where it writes the record (`workers.client.client`,
`workers.policy.sampling`); the simulator's engine writes the records itself, so this
applies the same rule to what it publishes, before the event log and the control plane see
it: a kept record is written as v9 with its inclusion probability, a dropped one and its
label are counted (``unsampled``) and go nowhere, and the holdout's are always kept. The log
holds what a sampled fleet would have written, so replaying it gives the same targets. At
the default 1.0 `make_simulation` returns the plain engine, so every golden is unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from schemas.contract import SAMPLED_VERSION, Event, OutcomeLabel, RoutingOutcome
from sim.engine import Simulation
from sim.scenario import Scenario
from workers.policy.holdout import in_holdout
from workers.policy.sampling import decision_inclusion


class SampledSimulation(Simulation):
    """`Simulation` whose clients log a ``decision_sample`` share of their decisions."""

    def __init__(self, scenario: Scenario, base_dir: Path, controller: str, out_dir: Path,
                 **kwargs: Any) -> None:
        super().__init__(scenario, base_dir, controller, out_dir, **kwargs)
        self.decision_sample = scenario.client.decision_sample
        self.holdout_fraction = scenario.client.holdout_fraction
        #: Records and labels left out, by topic.
        self.unsampled: dict[str, int] = {"outcomes": 0, "labels": 0}

    def _publish(self, ts: int, topic: str, key: str, value: Event) -> None:
        if topic == "outcomes" and isinstance(value, RoutingOutcome):
            inclusion = decision_inclusion(value.request_id, self.decision_sample,
                                           value.holdout)
            if inclusion is None:
                self.unsampled["outcomes"] += 1
                return
            if inclusion < 1.0:
                value = msgspec.structs.replace(value, v=max(value.v, SAMPLED_VERSION),
                                                inclusion=inclusion)
        elif topic == "labels" and isinstance(value, OutcomeLabel):
            rid = value.request_id
            if decision_inclusion(rid, self.decision_sample,
                                  in_holdout(rid, self.holdout_fraction)) is None:
                self.unsampled["labels"] += 1
                return
        super()._publish(ts, topic, key, value)

    def run(self) -> dict[str, Any]:
        summary = super().run()
        summary["decisions_unsampled"] = dict(self.unsampled)
        return summary


def make_simulation(scenario: Scenario, base_dir: Path, controller: str, out_dir: Path,
                    **kwargs: Any) -> Simulation:
    """The engine for ``scenario``: sampled when its clients log less than every decision."""
    if scenario.client.decision_sample < 1.0:
        return SampledSimulation(scenario, base_dir, controller, out_dir, **kwargs)
    return Simulation(scenario, base_dir, controller, out_dir, **kwargs)
