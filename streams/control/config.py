"""Control-plane configuration: frozen structs with working defaults, TOML files, CLI overrides.

One ``ControlConfig`` drives the live agents, the offline replayer and the simulator, so a run
is reproducible from its config file plus its event log. Every field has a default that works
on the local demo; a bad key anywhere (file or override) raises ``ConfigError`` naming it.

Regions differ (an SLA agreed per market, a smaller pool that wants gentler gains), so a file
may override any key for one scope in a ``[scopes.<region>]`` table. ``ControlConfig.for_scope``
is the one place that turns the file into the config a scope's controller runs with; the live
agents, offline replay and the simulator all build their controllers through it. Overrides are
resolved when the config is built, so a bad one stops the process at start naming
``scopes.<region>.<key>``.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from streams.control.pid import PidConfig

Positive = Annotated[float, Meta(gt=0.0)]
NonNeg = Annotated[float, Meta(ge=0.0)]
Share = Annotated[float, Meta(ge=0.0, le=1.0)]
Segment = tuple[Positive, NonNeg]
"""(width in accelerator units, value per unit) of one piece of a concave value curve."""


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


class _Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class RmaConfig(_Config, frozen=True, kw_only=True):
    """Rank-more-candidates: a PID on ranking p99 whose output is extra candidates/request."""

    sla_p99_ms: Positive = 100.0
    margin: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.8
    """The PID aims at ``sla_p99_ms * margin`` so noise around the aim stays inside the SLA."""
    kp: float = 0.05
    """Candidates per ms of error (error = setpoint - p99, positive when latency is low)."""
    ki: float = 0.02
    """Candidates per ms of error per second."""
    kd: float = 0.0
    max_extra_candidates: Annotated[int, Meta(ge=0, le=10_000)] = 256
    max_step: Positive | None = 16.0
    """Largest raise of extra candidates per period."""
    max_step_down: Positive | None = 64.0
    """Largest PID cut per period (budget and overload cuts are immediate regardless)."""
    integral_min: float | None = None
    integral_max: float | None = None
    candidates_per_cpu_unit_s: Positive = 2000.0
    """CPU side of an extra candidate (retrieval, features): not measured, a cap."""
    candidates_per_accel_unit_s: Positive = 5000.0
    """Prior of the units/s one accelerator unit scores; the measured cost replaces it."""
    overload_cut: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.5
    """When p99 exceeds the SLA itself, extra work is cut to this share of its last value."""
    min_request_rate: Positive = 1.0
    """Floor on the measured request rate when dividing the budget (no traffic seen != free)."""
    slow_start_below: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5
    """While the ranking p99 is under this share of the SLA, extra candidates may grow by
    ``increase_ratio`` per period rather than by the PID's step (0 turns it off)."""
    increase_ratio: Annotated[float, Meta(ge=1.0, le=4.0)] = 2.0

    @property
    def setpoint_ms(self) -> float:
        return self.sla_p99_ms * self.margin

    def pid(self) -> PidConfig:
        return PidConfig(kp=self.kp, ki=self.ki, kd=self.kd, setpoint=self.setpoint_ms,
                         out_min=0.0, out_max=float(self.max_extra_candidates),
                         max_step=self.max_step, max_step_down=self.max_step_down,
                         integral_min=self.integral_min, integral_max=self.integral_max)


class SbmConfig(_Config, frozen=True, kw_only=True):
    """Serve-a-better-model: coverage from serviceable capacity, and segment estimates."""

    sla_p99_ms: Positive = 250.0
    max_coverage: Share = 0.5
    headroom: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.8
    """Share of serviceable powerful-model throughput that coverage may plan to use."""
    powerful_rps_per_accel_unit: Positive = 20.0
    """Prior of the requests/s one accelerator unit serves on the powerful model; the measured
    cost replaces it."""
    trim_factor: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.7
    """Coverage is multiplied by this each period the powerful pools' p99 exceeds its SLA."""
    max_increase_per_period: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.05
    slow_start_below: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.4
    """While the powerful pools' p99 is under this share of the way from their latency floor
    (the lowest p99 judged) to the SLA, coverage may grow by ``increase_ratio`` per period
    instead of ``max_increase_per_period`` (0 turns it off). 0.4, not 0.5: at 0.5 `demo`
    (seed 11) had one window with the powerful p99 over the deadline, at 0.4 none, and
    `preemption_storm_tight` gained the same 2.8% at both (`SbmPolicy.slow_start_ms`)."""
    increase_ratio: Annotated[float, Meta(ge=1.0, le=4.0)] = 2.0
    max_segments: Annotated[int, Meta(ge=1, le=10_000)] = 256
    prior_mean: float = 0.0
    """Prior mean of a model's value before any outcome is seen anywhere."""
    prior_std: Positive = 1.0
    """Prior std of a segment's mean value around the model's fleet-wide mean."""
    prior_obs_std: Positive = 1.0
    """Assumed std of single outcome values before the data says otherwise."""
    prior_obs_weight: Positive = 10.0
    """Pseudo-observations behind ``prior_obs_std`` when estimating outcome noise."""
    max_effective_n: Annotated[int, Meta(ge=1)] = 100_000
    """Beyond this many outcomes, estimates become moving averages (they can track drift)."""


class PrecomputeShareConfig(_Config, frozen=True, kw_only=True):
    """How the control plane sets the precompute lever's share of a lent replica
    (``streams.control.precompute_share``)."""

    max_share: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.8
    """The most the targets allow; each replica's own ``precompute.max_share`` caps it too."""
    probe_share: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.1
    """The share while the answers are measured to make rankings worse: enough for the
    answer holdout to go on measuring them."""


def _segments(*pairs: tuple[float, float]) -> tuple[Segment, ...]:
    return tuple(pairs)


class AllocatorConfig(_Config, frozen=True, kw_only=True):
    """How spare capacity is split between the levers (see ``allocator``)."""

    cpu_per_accel_for_rma: Positive = 4.0
    """RMA needs this many CPU units per accelerator unit (retrieval and features)."""
    powerful_model_accelerators: tuple[str, ...] = ("a100", "h100", "h200")
    """Accelerator types the powerful model has an artifact for: lent units of these that no
    model holds yet may be given to SBM. A type a powerful-model pool already serves on is
    SBM's too, listed or not (a replica serving there is proof it runs)."""
    rma_value_segments: tuple[Segment, ...] = _segments(
        (8.0, 1.0), (16.0, 0.5), (32.0, 0.25), (64.0, 0.1))
    sbm_value_segments: tuple[Segment, ...] = _segments(
        (4.0, 1.5), (8.0, 0.8), (16.0, 0.3), (64.0, 0.1))
    learn_curves: bool = True
    """Replace the two curves above (then only the prior) by the value measured from joined
    labels once both levers are measured (``streams.control.value_curves.learned_curves``)."""

    def __post_init__(self) -> None:
        for name in ("rma_value_segments", "sbm_value_segments"):
            values = [value for _, value in getattr(self, name)]
            if any(b > a for a, b in itertools.pairwise(values)):
                raise ValueError(f"{name}: value per unit must not increase from one segment "
                                 f"to the next (diminishing returns), got {values}")


class CostConfig(_Config, frozen=True, kw_only=True):
    """How the cost of a unit of work is learned from the replicas' reports (``cost``)."""

    target_utilisation: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.7
    """Share of the lent capacity's time the levers' budgets plan to fill."""
    provisioned_utilisation: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.2
    """Share of the provisioned ranking replicas' time that baseline and extra candidates
    together may fill, measured from their busy time; 0 budgets extra candidates on lent
    capacity only. It lets optional work into the idle time of the replicas bought for the
    peak, where the PID on tail latency is the guard between it and a traffic spike, so it
    stays well under ``target_utilisation``: 0.2 kept the SLA on every shipped scenario and
    seeds 1-2 of the busiest, where 0.3 broke one window of ``azure_steady_tight`` in a
    one-second burst (docs/concepts.md, *Provisioned replicas' idle time*)."""
    prior_weight_s: Positive = 2.0
    """Busy replica-seconds of pseudo-evidence behind the configured rates (the prior)."""
    half_life_s: Positive = 60.0
    """Evidence this old weighs half as much as new: the cost follows model or load changes."""
    cap_ratio: Annotated[float, Meta(ge=1.0)] = 20.0
    """The measured cost stays within this factor of the prior either way."""
    per_accelerator: bool = True
    """Price each accelerator type's unit by its own measured work against its model's
    average one (``CostModel.speeds``); off, every lent unit of a model is its average, as
    before types were told apart (kept to measure what telling them apart is worth)."""


class LabelsConfig(_Config, frozen=True, kw_only=True):
    """The join of decision records with their late outcome labels (`streams.control.labels`)
    and the estimates made from it (`streams.control.offpolicy`)."""

    window_s: Positive = 600.0
    """Attribution window: a label arriving later than this after its decision is ``late``
    (counted, not used)."""
    max_pending: Annotated[int, Meta(ge=1, le=10_000_000)] = 200_000
    """Decisions held per scope waiting for their label; past it the oldest are dropped
    (counted ``evicted``), so a flood cannot grow memory without bound."""
    confidence: Annotated[float, Meta(gt=0.5, lt=1.0)] = 0.95
    """Level of the lift and gain intervals (normal approximation)."""
    min_labels: Annotated[int, Meta(ge=1)] = 30
    """Labels an arm needs before its estimate replaces the configured prior."""


class ControlConfig(_Config, frozen=True, kw_only=True):
    """Everything the control core needs; the Faust app adds only Kafka settings."""

    period_s: Positive = 10.0
    ttl_s: Annotated[float, Meta(gt=0.0, le=86_400.0)] = 30.0
    min_samples: Annotated[int, Meta(ge=1)] = 50
    """A window with fewer latency samples than this does not move any controller."""
    relative_accuracy: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.02
    max_pools: Annotated[int, Meta(ge=1)] = 10_000
    forget_pool_after_periods: Annotated[int, Meta(ge=1)] = 6
    """A pool silent for this many periods is dropped from the window set."""
    max_dt_periods: Annotated[float, Meta(ge=1.0)] = 3.0
    """A PID step never integrates more than this many periods (e.g. after a long restart)."""
    preemption_tombstone_s: Positive = 600.0
    """How long a preemption blocks older grants of the same pool that arrive late."""
    rma: RmaConfig = msgspec.field(default_factory=RmaConfig)
    sbm: SbmConfig = msgspec.field(default_factory=SbmConfig)
    precompute: PrecomputeShareConfig = msgspec.field(default_factory=PrecomputeShareConfig)
    allocator: AllocatorConfig = msgspec.field(default_factory=AllocatorConfig)
    cost: CostConfig = msgspec.field(default_factory=CostConfig)
    labels: LabelsConfig = msgspec.field(default_factory=LabelsConfig)
    scopes: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    """Per-scope overrides: ``{"eu1": {"period_s": 5.0, "rma": {"sla_p99_ms": 80.0}}}`` (a
    ``[scopes.eu1]`` table in TOML). Any key above but ``scopes`` itself; a scope not named
    runs with the keys above. Read them through ``for_scope``, never directly."""

    def __post_init__(self) -> None:
        for scope in self.scopes:
            _resolve(self, scope)  # raises naming scopes.<scope>.<key>: a bad one stops start

    @property
    def ttl_ms(self) -> int:
        return round(self.ttl_s * 1000)

    @property
    def period_ms(self) -> int:
        return round(self.period_s * 1000)

    def for_scope(self, scope: str) -> ControlConfig:
        """The config the controller of ``scope`` runs with: these keys, with that scope's
        ``[scopes.<scope>]`` overrides applied (and no ``scopes`` table of its own)."""
        if scope not in self.scopes:
            return self if not self.scopes else msgspec.structs.replace(self, scopes={})
        return _resolve(self, scope)

    def periods_ms(self) -> tuple[int, ...]:
        """Every control period in use, shortest first (the base one and each scope's): the
        live tick timer runs at half the shortest, offline replay ticks on their union."""
        return tuple(sorted({self.period_ms} | {self.for_scope(s).period_ms
                                                for s in self.scopes}))


_SCOPE_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _resolve(config: ControlConfig, scope: str) -> ControlConfig:
    """``config`` with ``scope``'s overrides merged in; ValueError names the offending key."""
    where = f"scopes.{scope}"
    if not _SCOPE_NAME.fullmatch(scope):
        raise ValueError(f"scopes: scope name {scope!r} must be letters, digits, '_' or '-' "
                         f"(a bare TOML key, as regions are named)")
    override = config.scopes[scope]
    if not isinstance(override, dict):
        raise ValueError(f"{where}: expected a table of control keys, got {override!r}")
    tree = copy.deepcopy(msgspec.to_builtins(msgspec.structs.replace(config, scopes={})))
    del tree["scopes"]
    _merge(tree, override, where)
    try:
        return msgspec.convert(tree, ControlConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc).replace("`$.", f"`{where}.").replace("`$`", f"`{where}`")
                         ) from None


def _merge(tree: dict[str, Any], override: Mapping[str, Any], where: str) -> None:
    """Replace the keys ``override`` names in ``tree``: tables merge key by key, any other
    value replaces the default whole. An unknown key is refused with the keys known there."""
    for key, value in override.items():
        at = f"{where}.{key}"
        if key not in tree:
            known = ", ".join(sorted(tree))
            raise ValueError(f"unknown config key {at!r} (known here: {known})")
        if isinstance(tree[key], dict):
            if not isinstance(value, dict):
                raise ValueError(f"{at}: expected a table, got {value!r}")
            _merge(tree[key], value, at)
        else:
            tree[key] = value


def _convert(obj: Any, strict: bool, where: str) -> ControlConfig:
    if isinstance(obj, dict) and "scopes" in obj and not isinstance(obj["scopes"], dict):
        raise ConfigError(f"{where}: scopes: expected [scopes.<region>] tables, "
                          f"got {obj['scopes']!r}")
    try:
        return msgspec.convert(obj, ControlConfig, strict=strict)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_config(path: str | Path) -> ControlConfig:
    """Read a TOML file; missing keys take defaults, unknown or bad keys raise ConfigError."""
    path = Path(path)
    try:
        raw = msgspec.toml.decode(path.read_bytes())
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    return _convert(raw, strict=True, where=str(path))


def with_overrides(config: ControlConfig, overrides: Mapping[str, Any]) -> ControlConfig:
    """A copy of ``config`` with dotted keys replaced, e.g. ``{"rma.kp": 0.5}``.

    Values may be strings (from a command line): they are converted to the field's type.
    A comma-separated string sets a list field such as ``allocator.powerful_model_accelerators``.
    """
    tree = copy.deepcopy(msgspec.to_builtins(config))
    for key in sorted(overrides):
        node = tree
        parts = key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                known = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a table)"
                raise ConfigError(f"unknown config key {key!r} (at {'.'.join(parts[:depth + 1])!r};"
                                  f" known here: {known})")
            if depth < len(parts) - 1:
                node = node[part]
        value = overrides[key]
        if isinstance(node[parts[-1]], (list, tuple)) and isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        node[parts[-1]] = value
    return _convert(tree, strict=False, where=f"overrides {sorted(overrides)}")

