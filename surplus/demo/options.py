"""What a demo run is given and what it settles on before it starts anything: its options, the
ports of its processes, its fixed names, its signing key, and the two ways it ends early
(`DemoError`, `Interrupted`)."""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from surplus import localkafka
from surplus.demo import slices
from surplus.live import plan

DEFAULT_PREFIX = "surplus.demo."
APP_ID = "surplus-demo-control"
LEAD_S = 8.0
"""Seconds between launching the scheduler and load generator and the start of their timeline."""
BACKGROUND = frozenset({"control-plane", "recorder", "prometheus"})
"""Children off the serving path and the preemption path: on the demo's shared cores they run
at ``DemoOptions.background_nice``, so a burst of their work (a control tick, a batch of
labels) waits for the workers, the broker and the load rather than delaying a notice or a
baseline request. In a deployment they would not share the serving replicas' cores at all."""


class DemoError(RuntimeError):
    """The run cannot go on; the message says which part failed and why."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: stop starting things and shut down."""


@dataclass(frozen=True)
class DemoOptions:
    out: Path
    duration_s: float = 180.0
    scenario: str = plan.DEFAULT_SCENARIO
    bootstrap: str | None = None
    prefix: str | None = None
    prometheus: bool = False
    rate: float | None = None
    progress_every_s: float = 5.0
    background_nice: int = 10
    """Niceness of the ``BACKGROUND`` children (0: as the rest)."""
    provisioned_nice: int = -5
    """Niceness of the provisioned (baseline-tier) replicas. On a fleet they run on hardware
    of their own; on the demo's shared cores they stand for it, so they come first: at the
    moment of a reclaim the broker, the dying replicas' goodbyes, the control plane and the
    load generator all wake at once, and a provisioned replica at niceness 0 on a busy
    two-core host waited up to 60 ms behind them (a baseline request over the SLA that no
    optional work caused). A negative niceness needs root (CAP_SYS_NICE); elsewhere the
    replica runs at 0 and the run says so."""
    opportunistic_nice: int = 5
    """Niceness of the opportunistic replicas (0: as the provisioned ones). Harvested
    capacity is best-effort: on the demo's shared cores a burst of optional work on a lent
    replica must not take the CPU from the provisioned replica's baseline work. On a fleet the
    lent replicas run on hardware of their own. In a CPU slice the quota is what bounds it
    instead: the slice weighs as a nice-0 process, so on a busy host it still gets the quota
    it was lent (a lent slice is its own, as on a fleet), and the niceness only orders the
    replica's threads among themselves."""
    cores_per_unit: float = 0.5
    """CPU cores one lent unit of the demo's ``cpu`` accelerator is: each opportunistic
    replica runs in a CPU slice of its grant's units (one per replica) times this, so what is
    lent bounds what the replica can do. 0.5 leaves the provisioned replica, the broker, the
    control plane and the load generator a core of a two-core machine between them."""
    slice_period_us: int = slices.DEFAULT_PERIOD_US
    """The slices' quota period (see ``slices.DEFAULT_PERIOD_US``)."""
    slices: bool = True
    """Run the opportunistic replicas in CPU slices (cgroups) where this host allows it."""


@dataclass
class Ports:
    control: int
    scheduler: int
    loadgen: int
    workers: dict[str, int]

    @classmethod
    def free(cls, replicas: list[plan.Replica]) -> Ports:
        """Free loopback ports for the run's listeners, picked together: picked one by one,
        two were once the same (nothing binds a port until its process starts)."""
        control, scheduler, loadgen, *workers = localkafka.free_ports(3 + len(replicas))
        return cls(control=control, scheduler=scheduler, loadgen=loadgen,
                   workers={r.worker_id: port for r, port in zip(replicas, workers, strict=True)})



def signing_dir(out: Path) -> Path:
    """A key of this run's own, in a key directory every process is given: the control
    plane signs targets and checks the scheduler's grants and notices, the scheduler
    signs them, workers and the load's client check all they read (docs/security.md)."""
    keys = out / "keys"
    shutil.rmtree(keys, ignore_errors=True)
    keys.mkdir(parents=True)
    key = keys / "demo"
    key.write_text(secrets.token_hex(32))
    key.chmod(0o600)
    return keys
