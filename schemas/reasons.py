"""The contract's vocabulary of reasons: why optional work was not done, and what kept a lever
from doing more. One spelling for workers, clients, the control plane, the simulator, metrics
and the event log (`schemas.contract` carries them on the wire)."""

from __future__ import annotations

from typing import Literal, get_args

#: Why a unit of optional work was not done. One spelling for the worker's counters, its
#: Prometheus labels, WindowReports, simulator summaries and the event log. On the wire the key
#: stays a plain name, so a reader older than a new reason still accepts the report.
ShedReason = Literal[
    "overload",        # the predicted queue wait passed the bound; lowest value first
    "deadline",        # its deadline passed while it waited
    "preemption",      # the replica is being reclaimed
    "budget",          # the fleet's optional-work budget is spent for now
    "stale_targets",   # no trusted, fresh targets: baseline only (fail safe)
    "over_target",     # more extra candidates than the targets allow
    "model_failure",   # the model raised on its batch
    "shutdown",        # the worker is stopping
]
SHED_REASONS: tuple[ShedReason, ...] = get_args(ShedReason)

#: What keeps a lever from doing more optional work (v2): the latency SLA, the extra-work
#: budget, the lent capacity, a configured maximum, too little traffic worth it, a
#: preemption, too few samples to act on (hold), or an operator's cap.
LimitReason = Literal["sla", "budget", "capacity", "max", "demand", "preemption", "hold",
                      "operator"]
LIMIT_REASONS: tuple[LimitReason, ...] = get_args(LimitReason)
