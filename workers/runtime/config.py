"""One worker's configuration: identity, model, HTTP, batching, admission, limits, Kafka.

Loaded from a TOML file plus overrides (``surplus worker`` flags) and validated once at start:
an unknown key, a wrong type or an out-of-range value stops the process with the key's path in
the message, before any model is loaded or port is bound.

Kafka is optional. Without a ``[kafka]`` table the worker serves with no targets, which means
baseline only (invariant 2); with one, its keys are :class:`schemas.kafka_config.KafkaSettings`
fields and any key left out falls back to ``SURPLUS_KAFKA_*`` in the environment.
"""

from __future__ import annotations

import copy
import socket
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta
from pydantic import ValidationError

from schemas.contract import Tier
from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring, KeySource
from workers.features import SpecError
from workers.policy.admission import AdmissionConfig
from workers.policy.precompute import PrecomputeConfig
from workers.policy.replica import serves_whole_requests
from workers.policy.targets import LocalLimits
from workers.runtime.batching import BatchingConfig
from workers.runtime.models import ModelSpec

Name = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:\-]+$")]


class ConfigError(ValueError):
    """The worker cannot start with this configuration; the message names the key."""


class WorkerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Everything one inference worker needs to know at start."""

    worker_id: Name
    region: Name = "eu1"
    service: Name = "rank"
    tier: Tier = "baseline"
    accelerator: Name = "cpu"
    #: This replica stands in for its pool's accelerator on other hardware (a test or staging
    #: fleet of CPUs carrying a GPU pool's ids): the device follows ``model.device`` alone and
    #: is not checked against the pool (`workers.runtime.devices`). Its measured cost is not
    #: that accelerator's; never set it in a fleet that lends capacity.
    accelerator_stand_in: bool = False
    #: Defaults to ``{region}/{service}/{model}/{accelerator}/{tier}`` (see :attr:`pool`).
    pool_id: Annotated[str, Meta(min_length=1, max_length=200)] | None = None
    model: ModelSpec = ModelSpec()
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65_535)] = 8080
    max_body_bytes: Annotated[int, Meta(ge=1024, le=64 << 20)] = 1 << 20
    #: Responses on one keep-alive connection before it is closed (``Connection: close``; 0:
    #: never). A client's pool reuses every connection in turn, so none idles out and the
    #: pool otherwise keeps every connection the busiest burst of its life opened (see
    #: ``server._recycle_connections``); nginx's ``keepalive_requests`` long defaulted to 100.
    max_requests_per_connection: Annotated[int, Meta(ge=0, le=1_000_000)] = 100
    batching: BatchingConfig = BatchingConfig()
    precompute: PrecomputeConfig = PrecomputeConfig()
    admission: AdmissionConfig = AdmissionConfig()
    limits: LocalLimits = LocalLimits()
    #: This replica's share of the fleet's optional-work budget in the targets.
    budget_share: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    report_interval_s: Annotated[float, Meta(ge=0.05, le=3600.0)] = 1.0
    #: /readyz waits at most this long for the targets topic to be read to its end.
    readiness_timeout_s: Annotated[float, Meta(ge=0.0, le=600.0)] = 10.0
    #: How far back the preemption topic is read at start (a notice may predate a restart).
    preemption_lookback_s: Annotated[float, Meta(ge=0.0, le=86_400.0)] = 300.0
    #: SIGTERM to exit at most (Kubernetes' terminationGracePeriodSeconds); also the notice an
    #: opportunistic replica gives the control plane of its own going.
    shutdown_grace_s: Annotated[float, Meta(gt=0.0, le=3600.0)] = 30.0
    #: Accelerator units this replica holds: what its own notice takes off its pool's grant.
    accelerator_units: Annotated[float, Meta(ge=0.0, le=1024.0)] = 1.0
    #: Shared HMAC key: when set, unsigned or forged targets and notices (Kafka and
    #: ``POST /v1/preempt``) are refused, and this replica's own SIGTERM notice is signed.
    targets_signing_key: str | None = None
    #: The keys read from a file (one key, id ``default``) or a key directory (one file per
    #: key id, ``active`` naming the signing one; ``surplus worker --signing-key-file``).
    targets_signing_key_file: str | None = None
    #: Seconds between re-reads of ``targets_signing_key_file`` (a rotation needs no
    #: restart); 0: read once at start.
    signing_reload_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 10.0
    #: With a key: a signed ``POST /v1/preempt`` is refused when the time it was signed at
    #: is further than this from now either way (a replayed request, or a clock far off).
    notice_request_window_s: Annotated[float, Meta(gt=0.0, le=3600.0)] = 30.0
    #: The base URL clients reach this replica at, announced on the replicas topic (default:
    #: ``http://{host}:{bound port}``, the host name where it binds every address).
    advertise_url: Annotated[str, Meta(pattern=r"^https?://", max_length=500)] | None = None
    #: How long a membership announcement holds: a replica killed outright leaves the clients'
    #: routing set this long after its last renewal. Renewed every third of it.
    membership_lease_s: Annotated[float, Meta(ge=0.3, le=120.0)] = 6.0
    #: Networks ``POST /v1/preempt`` takes notices from (CIDR). A notice only stops optional
    #: work, but a stranger must not be able to: by default the machine itself (the pod's
    #: capacity agent, a scheduler on the same host).
    notice_from: Annotated[tuple[str, ...], Meta(max_length=100)] = ("127.0.0.0/8", "::1/128")
    #: The key of this replica's reports: ``scope`` (its region: one control-plane process
    #: reads the region's telemetry) or ``replica`` (its worker id: the region's reports
    #: spread over the partitions, for a control plane run with ``stages = 2``).
    telemetry_key: Literal["scope", "replica"] = "scope"
    kafka: dict[str, Any] | None = None

    @property
    def pool(self) -> str:
        """The pool this replica belongs to (telemetry key, preemption match)."""
        return self.pool_id or "/".join(
            (self.region, self.service, self.model.name, self.accelerator, self.tier))

    def endpoint(self, bound_port: int) -> str:
        """The URL this replica announces (`advertise_url`, or where it listens)."""
        if self.advertise_url is not None:
            return self.advertise_url.rstrip("/")
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"http://{host}:{bound_port}"

    @property
    def whole_request_optional(self) -> bool:
        """An opportunistic replica of the powerful model only ever does optional work."""
        return serves_whole_requests(self.model.name, self.tier)

    def notice_networks(self) -> tuple[IPv4Network | IPv6Network, ...]:
        """``notice_from`` parsed; a bad entry stops the worker at start, naming it."""
        nets = []
        for i, text in enumerate(self.notice_from):
            try:
                nets.append(ip_network(text, strict=False))
            except ValueError as exc:
                raise ConfigError(f"bad worker config at `notice_from[{i}]`: {exc}") from None
        return tuple(nets)

    def keys(self) -> KeySource | None:
        """The keyring targets and notices must be signed with (and this replica signs its
        own notice with), or None when signatures are not checked. A key file or directory
        that cannot be read stops the worker at start, naming the key and the file."""
        if self.targets_signing_key is not None and self.targets_signing_key_file is not None:
            raise ConfigError("bad worker config at `targets_signing_key_file`: give it or "
                              "`targets_signing_key`, not both")
        if self.targets_signing_key_file is not None:
            try:
                return KeySource(self.targets_signing_key_file)
            except ValueError as exc:
                raise ConfigError(f"bad worker config at `targets_signing_key_file`: "
                                  f"{exc}") from None
        if self.targets_signing_key is not None:
            if not self.targets_signing_key:
                raise ConfigError("bad worker config at `targets_signing_key`: empty key")
            return KeySource.fixed(Keyring.of(self.targets_signing_key))
        return None

    def kafka_settings(self) -> KafkaSettings | None:
        """The Kafka client settings, or None when this worker runs without Kafka."""
        if self.kafka is None:
            return None
        try:
            return KafkaSettings(**self.kafka)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"bad worker config at `kafka{'.' + key if key else ''}`: "
                              f"{err['msg']}") from None


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"bad worker config at `{dotted}`: `{part}` is not a table")
        node = child
    node[leaf] = value


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                defaults: dict[str, Any] | None = None) -> WorkerConfig:
    """Read TOML (if given) over ``defaults``, apply ``{"dotted.key": value}`` overrides
    (None values are skipped), and validate everything.

    Raises :class:`ConfigError` naming the offending key; nothing has started yet.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            tree = msgspec.toml.decode(Path(path).read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read worker config {path}: {exc.strerror}") from None
        except msgspec.DecodeError as exc:
            raise ConfigError(f"worker config {path} is not valid TOML: {exc}") from None
    tree = {**copy.deepcopy(defaults or {}), **copy.deepcopy(tree)}
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(tree, dotted, value)
    try:
        config = msgspec.convert(tree, WorkerConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad worker config: {exc}") from None
    config.kafka_settings()  # fail now, not when the first Kafka client starts
    config.keys()
    config.notice_networks()
    _check_backend(config)
    _check_inputs(config)
    _check_precompute(config)
    files = {"model.path": config.model.path,
             **{f"model.artifacts.{d}": p for d, p in sorted(config.model.artifacts.items())}}
    for key, path in files.items():
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"bad worker config at `{key}`: model file {path} does not exist")
    return config


def _check_precompute(config: WorkerConfig) -> None:
    """Precompute is optional work on lent capacity: a baseline replica spending its
    provisioned time on it is a mistake. (Its Kafka is checked once the command line's
    Kafka flags are merged in: `check_precompute_kafka`.)"""
    if config.precompute.enabled and config.tier != "opportunistic":
        raise ConfigError("bad worker config at `precompute.enabled`: only an opportunistic "
                          f"(lent) replica does precompute work, and this one is {config.tier}")


def check_precompute_kafka(config: WorkerConfig) -> None:
    """Precompute jobs come from Kafka: a worker told to do them with none stops at start."""
    if config.precompute.enabled and config.kafka is None:
        raise ConfigError("bad worker config at `precompute.enabled`: precompute jobs come "
                          "from Kafka, and this worker has no [kafka] table or --bootstrap")


def _check_backend(config: WorkerConfig) -> None:
    """The model's backend and the tables it needs agree (a torch worker with a stray
    ``[model.oip]`` would silently score in process)."""
    model = config.model
    if model.backend == "oip":
        if model.oip is None:
            raise ConfigError('bad worker config at `model.oip`: backend "oip" needs a '
                              "[model.oip] table with at least `url` and `model_name`")
        if model.path is not None or model.artifacts:
            key = "model.path" if model.path is not None else "model.artifacts"
            raise ConfigError(f'bad worker config at `{key}`: backend "oip" scores on the '
                              "model server; leave out the model files")
    elif model.oip is not None:
        raise ConfigError('bad worker config at `model.backend`: [model.oip] is set but the '
                          'backend is "torch"; set backend = "oip" to use the model server')


def _check_inputs(config: WorkerConfig) -> None:
    """The model's declared inputs can be served (distinct tensor names), and by a model that
    can take them: the reference models take only the fixed signature."""
    model = config.model
    try:
        model.signature()
    except SpecError as exc:
        raise ConfigError(f"bad worker config at {exc}") from None
    if model.inputs and model.path is None and not model.artifacts and model.backend == "torch":
        raise ConfigError("bad worker config at `model.inputs`: the reference models take "
                          "the fixed dense and sparse inputs; declare inputs for a model file "
                          "(`model.path`) or a model server (`backend = \"oip\"`)")
