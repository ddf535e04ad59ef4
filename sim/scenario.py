"""Scenario files: the fleet, its traffic, its spare capacity and what goes wrong, as TOML.

A scenario names regions; each region has request arrivals, request segments with their true
gains, and pools of replicas (model, accelerator, tier) with a service model: how many
candidates a replica scores per second, and a latency-vs-utilisation curve with lognormal
noise around it. Opportunistic pools get their replicas over time from a capacity shape
(constant, steps, diurnal or a CSV) with optional random reclaims; preemption storms reclaim
a share of the opportunistic pools at given times with a given notice. The ``[control]`` table
is a ``ControlConfig`` (the same keys as a control-plane config file), so the control loop is
tuned per scenario the way an operator tunes it per deployment.

Every struct forbids unknown keys, so a typo names itself. Paths to CSV files are resolved
against the scenario's directory and then its parents (``data/...`` works from a scenario
anywhere in the repository).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import Meta

from streams.control.config import ControlConfig
from workers.client.config import powerful_wait_ms
from workers.policy.admission import AdmissionConfig
from workers.policy.client_shed import ShedConfig
from workers.policy.precompute import PrecomputeConfig
from workers.policy.routing import RouterConfig
from workers.policy.targets import LocalLimits

Positive = Annotated[float, Meta(gt=0.0)]
NonNeg = Annotated[float, Meta(ge=0.0)]
Share = Annotated[float, Meta(ge=0.0, le=1.0)]
Count = Annotated[int, Meta(ge=0)]
Name = Annotated[str, Meta(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]


class ScenarioError(ValueError):
    """A scenario file is invalid; the message names the file and the key."""


class _Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class ArrivalsConfig(_Config, frozen=True, kw_only=True):
    """Request arrivals of one region.

    ``constant``: Poisson at ``mean_rps``. ``diurnal``: Poisson around a daily cosine with the
    given peak-to-trough ratio, peaking at ``peak_at_s`` (seconds into the period).
    ``trace``: a CSV with one row per request; its arrivals are counted per ``bin_s`` (whole
    steps), scaled to ``mean_rps`` and spread evenly over the bin's steps by cumulative
    rounding (at the trace's own rate every arrival is kept, exactly, in its own bin).
    ``rates``: a CSV of (time, rate) rows, held until the next row, scaled to ``mean_rps``,
    Poisson within each step. Traces longer than the scenario are cut at ``offset_s``; shorter
    ones repeat. ``onoff``: synthetic bursts, seeded by the scenario's seed: quiet (off) and
    burst (on) periods alternate with heavy-tailed (Pareto) lengths of at least ``off_min_s``
    and ``on_min_s`` (bursts cut at ``on_max_s``); a burst runs at ``peak_to_mean`` times
    ``mean_rps`` and the quiet rate is what keeps the mean at ``mean_rps``; Poisson per step.
    """

    kind: Literal["constant", "diurnal", "trace", "rates", "onoff"] = "constant"
    mean_rps: Positive = 40.0
    path: str | None = None
    time_column: str = "TIMESTAMP"
    time_format: str = "%Y-%m-%d %H:%M:%S.%f"
    """A ``strptime`` format, or ``s`` / ``ms`` for numeric seconds / milliseconds."""
    rate_column: str = "rate"
    bin_s: Positive = 1.0
    """The grain (seconds, rounded to whole steps) a ``trace`` keeps: scaling up a trace
    repeats each recorded request, and at a finer grain its copies would all arrive at once
    (see ``sim.traces``)."""
    offset_s: NonNeg = 0.0
    peak_to_trough: Annotated[float, Meta(ge=1.0)] = 3.0
    period_s: Positive = 86_400.0
    peak_at_s: NonNeg = 50_400.0
    peak_to_mean: Annotated[float, Meta(ge=1.0)] = 25.0
    on_min_s: Positive = 0.5
    on_max_s: Positive = 5.0
    off_min_s: Positive = 20.0
    pareto_shape: Annotated[float, Meta(gt=1.0)] = 1.5
    """Tail index of the on and off lengths (smaller: heavier tail; above 1 for a finite
    mean)."""

    def __post_init__(self) -> None:
        if self.on_max_s < self.on_min_s:
            raise ValueError("arrivals: on_max_s must be >= on_min_s")


class ReclaimsConfig(_Config, frozen=True, kw_only=True):
    """Random reclaims: a Poisson process of preemptions of part of the pool."""

    rate_per_hour: NonNeg = 0.0
    share: Share = 0.5
    notice_s: NonNeg = 30.0
    return_after_s: Positive = 300.0


class CapacityConfig(_Config, frozen=True, kw_only=True):
    """Opportunistic replicas of one pool over time (one accelerator unit = one replica).

    ``constant``: ``replicas``. ``steps``: ``[[time_s, replicas], ...]``. ``diurnal``: between
    ``min_replicas`` and ``max_replicas``, most at ``peak_at_s`` of each ``period_s``. ``csv``:
    rows of (time, units) or (time, region, accelerator, units); with region/accelerator
    columns only the rows of this pool's region and accelerator count. Whenever the shape
    drops, the scheduler reclaims the difference with ``notice_s`` of notice.
    """

    kind: Literal["constant", "steps", "diurnal", "csv"] = "constant"
    replicas: Count = 0
    steps: list[tuple[NonNeg, Count]] = []
    min_replicas: Count = 0
    max_replicas: Count = 0
    period_s: Positive = 86_400.0
    peak_at_s: NonNeg = 14 * 3600.0
    path: str | None = None
    time_column: str = "time"
    units_column: str = "units"
    region_column: str = "region"
    accelerator_column: str = "accelerator"
    notice_s: NonNeg = 30.0
    random_reclaims: ReclaimsConfig | None = None


class PoolConfig(_Config, frozen=True, kw_only=True):
    """Replicas of one model on one accelerator type, in one tier, and how they perform."""

    model: Literal["baseline", "powerful"] = "baseline"
    tier: Literal["baseline", "opportunistic"] = "baseline"
    accelerator: Name = "l4"
    service: Name = "rank"
    replicas: Count = 0
    """Replicas of a baseline-tier pool (opportunistic pools take theirs from ``capacity``)."""
    capacity: CapacityConfig | None = None
    units_per_s: Positive = 1000.0
    """Candidates one replica scores per second when busy all the time."""
    latency_curve: tuple[tuple[NonNeg, Positive], ...] = (
        (0.0, 20.0), (0.5, 24.0), (0.7, 30.0), (0.8, 36.0), (0.9, 50.0), (0.95, 70.0),
        (1.0, 110.0))
    """(utilisation, median latency ms) points, linearly interpolated, flat past the ends."""
    latency_sigma: NonNeg = 0.2
    """Lognormal sigma of a request's latency around the curve."""
    inflight_ms: Positive = 100.0
    """Work the replicas take into service at once, in ms of their throughput (batching)."""
    cpu_per_replica: NonNeg = 4.0
    grant_every_s: Positive = 10.0
    grant_ttl_s: Positive = 30.0
    notice_repeat_s: NonNeg = 0.0
    """The scheduler re-announces a pending reclaim this often until its deadline (a fresh
    notice id, the same deadline), as a cloud's interruption notice stays posted until the
    machine goes; 0: announced once."""

    def __post_init__(self) -> None:
        if len(self.latency_curve) < 2:
            raise ValueError("latency_curve needs at least two points")
        xs = [u for u, _ in self.latency_curve]
        if any(b <= a for a, b in itertools.pairwise(xs)):
            raise ValueError(f"latency_curve utilisations must increase, got {xs}")
        if self.tier == "opportunistic" and self.capacity is None:
            raise ValueError("an opportunistic pool needs a [capacity] table")
        if self.tier == "baseline" and self.capacity is not None:
            raise ValueError("a baseline-tier pool is provisioned ('replicas'), never lent: "
                             "no [capacity] table")
        if self.tier == "baseline" and self.model == "powerful":
            raise ValueError("the powerful model is served only by opportunistic replicas")

    def pool_id(self, region: str) -> str:
        return f"{region}/{self.service}/{self.model}/{self.accelerator}/{self.tier}"


class SegmentConfig(_Config, frozen=True, kw_only=True):
    """A group of requests: its traffic share, the value signal clients see, its true gain."""

    name: Name
    share: Positive
    value: NonNeg = 0.5
    """Mean of the request value signal (what admission orders optional work by)."""
    value_noise: NonNeg = 0.1
    gain: float = 0.1
    """True incremental value of serving the request with the powerful model."""
    outcome_noise: NonNeg = 0.2
    """Std of an observed outcome value around (value + gain if powerful)."""


class RegionConfig(_Config, frozen=True, kw_only=True):
    name: Name
    base_candidates: Annotated[int, Meta(ge=1, le=4096)] = 50
    max_extra_candidates: Annotated[int, Meta(ge=0, le=4096)] = 200
    """Extra candidates retrieval can offer beyond the base count."""
    deadline_ms: Positive = 100.0
    timeout_ms: Positive = 1000.0
    """A ranking response slower than this counts as a rejected baseline request."""
    sla_p99_ms: Positive | None = None
    """The ranking SLA judged in the summary (default: the control config's rma.sla_p99_ms)."""
    rma_gain: NonNeg = 0.05
    rma_scale: Positive = 50.0
    """Value of k extra candidates done for one request: rma_gain * ln(1 + k / rma_scale)."""
    arrivals: ArrivalsConfig = ArrivalsConfig()
    segments: list[SegmentConfig] = []
    pools: list[PoolConfig] = []

    def rma_value(self, extra: int) -> float:
        """Value of ``extra`` extra candidates scored for one request (concave in ``extra``)."""
        return self.rma_gain * math.log1p(max(extra, 0) / self.rma_scale)

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError(f"region {self.name}: at least one [[regions.segments]]")
        if not any(p.model == "baseline" and p.tier == "baseline" and p.replicas > 0
                   for p in self.pools):
            raise ValueError(f"region {self.name}: needs a baseline-tier ranking pool with "
                             "replicas (baseline work is provisioned, never harvested)")
        ids = [p.pool_id(self.name) for p in self.pools]
        if len(set(ids)) != len(ids):
            raise ValueError(f"region {self.name}: duplicate pools {sorted(ids)}")


class StormConfig(_Config, frozen=True, kw_only=True):
    """At ``at_s``, reclaim ``share`` of every matching opportunistic pool with ``notice_s``."""

    at_s: NonNeg
    share: Share = 1.0
    notice_s: NonNeg = 1.0
    return_after_s: Positive | None = None
    regions: list[str] = []
    """Regions hit (empty: all)."""
    models: list[Literal["baseline", "powerful"]] = []
    """Pools hit by model (empty: every opportunistic pool)."""


class StaticConfig(_Config, frozen=True, kw_only=True):
    """``static``: fixed targets, re-issued every period (the default: no optional work)."""

    extra_candidates: Annotated[int, Meta(ge=0, le=10_000)] = 0
    coverage: Share = 0.0
    budget_units_per_s: NonNeg = 0.0


class NaiveConfig(_Config, frozen=True, kw_only=True):
    """``naive``: the textbook controller a team writes first (see ``sim.controllers``)."""

    initial_extra: Annotated[int, Meta(ge=1)] = 8
    up: Annotated[float, Meta(gt=1.0)] = 1.1
    down: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.9
    raise_below: Share = 0.9
    """Raise while p99 < raise_below * SLA ..."""
    spare_above: Share = 0.3
    """... and the ranking pools have more than this share of capacity spare."""
    cut_above: Share = 0.95
    """Cut while p99 > cut_above * SLA."""
    coverage_target: Share = 0.3
    value_threshold: float = 0.7


class BestStaticConfig(_Config, frozen=True, kw_only=True):
    """``best-static`` (``--compare`` only): ``static`` swept over a grid of extra candidates x
    coverage; the best run with no baseline SLA-violation window and no rejected baseline
    request is the bar an adaptive controller must clear (see ``sim.best_static``). The point
    (0, 0), no optional work, is always run."""

    extra_candidates: list[Annotated[int, Meta(ge=0, le=10_000)]] = []
    """Empty: 0, 1/8, 1/4, 1/2 and all of ``control.rma.max_extra_candidates``."""
    coverage: list[Share] = []
    """Empty: 0, 1/4, 1/2 and all of ``control.sbm.max_coverage`` (just 0 without a powerful
    model pool)."""
    budget_units_per_s: NonNeg = 1e9
    """The RMA budget every run issues (default: no limit, as ``greedy``)."""


class ControllersConfig(_Config, frozen=True, kw_only=True):
    static: StaticConfig = StaticConfig()
    naive: NaiveConfig = NaiveConfig()
    best_static: BestStaticConfig = BestStaticConfig()


class WorkerConfig(_Config, frozen=True, kw_only=True):
    """The real worker policies' settings (as in a worker's TOML)."""

    admission: AdmissionConfig = AdmissionConfig()
    """``initial_ms_per_unit`` is replaced by each replica set's true cost per unit (a worker
    that has warmed up); everything else applies as written."""
    limits: LocalLimits = LocalLimits()
    model: dict[str, Any] = {}
    """A live run's ``[model.config]`` for its workers (sizes of the reference models; checked
    by the worker at start). The simulator's cost of a unit is each pool's ``units_per_s``."""
    precompute: PrecomputeConfig = PrecomputeConfig()
    """How a lent replica paces the precompute lever's slices (``enabled`` is the world's,
    ``[precompute]``; a live demo starts its lent workers with ``--precompute``)."""


class ClientConfigPart(_Config, frozen=True, kw_only=True):
    """The real client policies' settings (a ClientConfig without URLs or scope)."""

    powerful_deadline_share: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.6
    rma_burst_s: Annotated[float, Meta(gt=0.0, le=60.0)] = 1.0
    limits: LocalLimits = LocalLimits()
    router: RouterConfig = RouterConfig()
    shed: ShedConfig = ShedConfig()
    holdout_fraction: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.01
    """Requests (by request-id hash) that get no optional work: the lift's control group."""
    answer_holdout_fraction: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.05
    """Visits holding a fresh precompute answer (by request-id hash) ranked live without it:
    the precompute lever's control group (`ClientConfig.answer_holdout_fraction`)."""
    decision_sample: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    """Share of decision records the clients log, by request-id hash (holdout records
    always); the control plane weighs each by its inverse (`sim.sampling`)."""


class LabelsPlant(_Config, frozen=True, kw_only=True):
    """How outcome labels reach the control plane after a request is served: a log-normal
    delay (a click in seconds, a conversion in minutes), some never, some twice."""

    delay_median_s: Positive = 20.0
    delay_sigma: NonNeg = 1.2
    """Std of the log of the delay: at 1.2 about 1 label in 300 comes after 10 minutes."""
    lost: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.03
    """Share of requests whose outcome is never reported."""
    duplicated: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.01
    """Share of labels sent twice (a retrying labeller)."""

    def fate(self, lost_u: float, z: float, dup_u: float,
             unit: float = 1.0) -> tuple[float, bool] | None:
        """One label's fate from a uniform ``lost_u``, a standard normal ``z`` and a uniform
        ``dup_u``: None when it never comes, else its delay (seconds times ``unit``) and
        whether it comes a second time (as late again). The simulator and the demo's load
        generator draw their own numbers and share this rule."""
        if lost_u < self.lost:
            return None
        return unit * self.delay_median_s * math.exp(self.delay_sigma * z), dup_u < self.duplicated


class PrecomputePlant(_Config, frozen=True, kw_only=True):
    """The precompute lever's world: users who come back, and the jobs the service asks for.

    Requests belong to ``users`` users, visited by a Zipf law of exponent ``user_skew``; each
    user keeps its segment, dense features and retrieval run between visits, so an answer
    scored ahead of a visit ranks what the visit ranks. The service asks for a job for each
    user seen in the last ``recent_s`` (not again within ``refresh_s``): ``candidates`` extra
    candidates beyond the base, scored by ``model``, usable for ``ttl_s``."""

    enabled: bool = False
    users: Annotated[int, Meta(ge=1, le=10_000_000)] = 2_000
    user_skew: Annotated[float, Meta(gt=1.0, le=5.0)] = 1.2
    candidates: Annotated[int, Meta(ge=1, le=16_000)] = 1_024
    models: Annotated[tuple[Literal["baseline", "powerful"], ...],
                      Meta(min_length=1, max_length=2)] = ("baseline",)
    recent_s: Positive = 30.0
    refresh_s: Positive = 60.0
    ttl_s: Positive = 120.0
    #: Jobs a second at most (a cap; the rate follows what the replicas answer, measured).
    max_jobs_per_s: Positive = 100.0

    def visit_cdf(self) -> np.ndarray:
        """The cumulative share of visits by user rank (Zipf, ``user_skew``): a uniform draw
        searched in it is the visiting user, live (`surplus.live.draws`) and simulated."""
        weights = 1.0 / np.arange(1, self.users + 1, dtype=np.float64) ** self.user_skew
        return np.cumsum(weights / weights.sum())

    def answer_worth(self, region: RegionConfig, model: str, gain: float) -> float:
        """What a visit served from an answer of ``model`` is worth in the value model: the
        ranking over the job's extras, and the segment's ``gain`` from the powerful model."""
        return region.rma_value(self.candidates) + (gain if model == "powerful" else 0.0)


class DelaysConfig(_Config, frozen=True, kw_only=True):
    """How long messages take to reach workers and clients (ms)."""

    targets_ms: NonNeg = 30.0
    notice_min_ms: NonNeg = 2.0
    notice_max_ms: NonNeg = 10.0

    def __post_init__(self) -> None:
        if self.notice_max_ms < self.notice_min_ms:
            raise ValueError("delays: notice_max_ms must be >= notice_min_ms")


class Scenario(_Config, frozen=True, kw_only=True):
    name: Name = "scenario"
    description: str = ""
    duration_s: Positive = 600.0
    step_ms: Annotated[int, Meta(ge=1, le=10_000)] = 100
    report_interval_s: Positive = 1.0
    seed: int = 1
    start_ms: Annotated[int, Meta(ge=0)] = 1_700_006_400_000
    """Event time of the start (default: midnight UTC, 2023-11-15)."""
    sla_window_s: Positive | None = None
    """Length of the windows the summary judges the SLA on (default: control period_s)."""
    control: ControlConfig = ControlConfig()
    worker: WorkerConfig = WorkerConfig()
    client: ClientConfigPart = ClientConfigPart()
    controllers: ControllersConfig = ControllersConfig()
    delays: DelaysConfig = DelaysConfig()
    labels: LabelsPlant = LabelsPlant()
    precompute: PrecomputePlant = PrecomputePlant()
    regions: list[RegionConfig] = []
    storms: list[StormConfig] = []

    def __post_init__(self) -> None:
        if not self.regions:
            raise ValueError("a scenario needs at least one [[regions]]")
        names = [r.name for r in self.regions]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate region names {names}")
        report_ms = self.report_ms
        if report_ms % self.step_ms or self.control.period_ms % report_ms:
            raise ValueError(f"step_ms ({self.step_ms}) must divide report_interval_s "
                             f"({report_ms} ms), which must divide control.period_s "
                             f"({self.control.period_ms} ms)")
        if self.start_ms % self.control.period_ms:
            raise ValueError("start_ms must be a multiple of control.period_s (ticks fall on "
                             "the same grid live, in replay and here)")
        if self.sla_window_ms % self.step_ms:
            raise ValueError("sla_window_s must be a multiple of step_ms")
        for region in self.regions:
            self._check_powerful_budget(region)

    def _check_powerful_budget(self, region: RegionConfig) -> None:
        """An SBM SLA over the client's wait is a contradiction: the client waits for the
        powerful model ``client.powerful_deadline_share`` of the deadline, then falls back to
        the ranking pool, so the loop would hold the powerful replicas where the client has
        already given up on them."""
        if not any(p.model == "powerful" for p in region.pools):
            return
        control = self.control.for_scope(region.name)
        sla = control.sbm.sla_p99_ms
        budget = powerful_wait_ms(region.deadline_ms, self.client.powerful_deadline_share)
        if sla > budget:
            raise ValueError(
                f"control.sbm.sla_p99_ms ({sla:g} ms) is over region {region.name}'s powerful "
                f"budget, deadline_ms x client.powerful_deadline_share ({region.deadline_ms:g} "
                f"x {self.client.powerful_deadline_share:g} = {budget:g} ms): lower the SLA or "
                "raise the deadline")

    @property
    def report_ms(self) -> int:
        return round(self.report_interval_s * 1000)

    @property
    def duration_ms(self) -> int:
        return round(self.duration_s * 1000)

    @property
    def sla_window_ms(self) -> int:
        return round((self.sla_window_s or self.control.period_s) * 1000)


def load_scenario(path: str | Path, *, duration_s: float | None = None,
                  seed: int | None = None) -> tuple[Scenario, Path]:
    """Read a scenario TOML (and apply command-line overrides); returns it and its directory."""
    path = Path(path)
    try:
        raw = msgspec.toml.decode(path.read_bytes())
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except msgspec.DecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML ({exc})") from None
    if duration_s is not None:
        raw["duration_s"] = duration_s
    if seed is not None:
        raw["seed"] = seed
    try:
        scenario = msgspec.convert(raw, Scenario, strict=True)
    except msgspec.ValidationError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    return scenario, path.resolve().parent


def resolve_data(name: str, base: Path) -> Path:
    """A data file named in a scenario: relative to its directory, then to each parent."""
    candidate = Path(name)
    if candidate.is_absolute():
        return candidate
    for root in (base, *base.parents, Path.cwd()):
        if (root / candidate).is_file():
            return root / candidate
    raise ScenarioError(f"data file {name!r} not found from {base} or its parents")


SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


def find_scenario(name_or_path: str) -> Path:
    """A path as given, or the name of a scenario shipped in ``sim/scenarios``."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = SCENARIO_DIR / (name_or_path if name_or_path.endswith(".toml")
                              else f"{name_or_path}.toml")
    if shipped.is_file():
        return shipped
    known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.toml")))
    raise ScenarioError(f"no scenario file {name_or_path!r} (shipped: {known})")
