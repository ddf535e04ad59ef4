"""Settings of a control-plane process (not of the control laws: those are `ControlConfig`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.topics import SCOPE_PARTITIONS

if TYPE_CHECKING:
    from schemas.signing import KeySource


class ControlPlaneSettings(BaseSettings):
    """Process-level knobs, from `SURPLUS_CONTROL_*` or flags; validated at start."""

    model_config = SettingsConfigDict(env_prefix="SURPLUS_CONTROL_", frozen=True, extra="forbid")

    app_id: str = Field(default="surplus-control", min_length=1)
    config_path: Path | None = None
    partitions: int = Field(default=SCOPE_PARTITIONS, ge=1, le=1024)
    #: Replicas of the control plane's own topics (ticks, scope changelog). Unset:
    #: `surplus control-plane` asks the cluster (its broker count, up to 3, as for the
    #: catalog's topics), so state survives a broker lost wherever the cluster can hold it.
    replication_factor: int | None = Field(default=None, ge=1, le=16)
    metrics_port: int = Field(default=0, ge=0, le=65535)
    #: Loopback unless asked: prometheus-client would otherwise bind every interface.
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    data_dir: Path = Path(".surplus/control")
    loglevel: str = "warning"
    #: How long the group waits for a silent member before handing its partitions on: the time
    #: scopes go without targets after a control-plane process dies without leaving (kill -9,
    #: a lost machine). Faust's default of 60 s outlives a typical targets TTL.
    session_timeout_s: float = Field(default=10.0, ge=6.0, le=300.0)
    #: How old the consumer's view of partition leaders may grow before it asks again. aiokafka
    #: does not ask again when a committed-offset reset is told "not the leader": after a
    #: restart during broker churn the process kept asking a former leader and published no
    #: targets for 77 s (`surplus chaos --seed 4`), until something else refreshed the view.
    #: The default (5 min) bounds that stall; this does, at a metadata request every few seconds.
    metadata_max_age_s: float = Field(default=5.0, ge=1.0, le=300.0)
    #: A stable name for this process (a StatefulSet pod, a systemd unit): static group
    #: membership, so a process restarted in place takes its partitions back at once instead
    #: of after the session timeout. The cost: a named process that stops for good does not
    #: leave the group, so its scopes wait the session timeout before another takes them.
    instance_id: str | None = Field(default=None, min_length=1, max_length=249,
                                    pattern=r"^[A-Za-z0-9._-]+$")
    #: Whether Faust declares (creates when missing) each topic it reads as it subscribes. It
    #: asks the cluster's controller broker, and a start while that broker is down crashed
    #: Faust's conductor (NodeNotReadyError) and left a process that never ticked (`surplus
    #: chaos`: a control plane restarted during a broker kill published nothing for 35 s).
    #: `surplus control-plane` turns it off once it has found every topic there.
    declare_topics: bool = True
    #: Shared HMAC key: when set, every ControlTargets published is signed with it and every
    #: capacity event, notice and override read must verify against it (id ``default``).
    signing_key: SecretStr | None = None
    #: The keys from a file (one key, id ``default``) or a key directory (a file per key id,
    #: ``active`` naming the signing one): keeps them out of the environment and argv.
    signing_key_file: Path | None = None
    #: Seconds between re-reads of ``signing_key_file`` (a rotation needs no restart); 0: once.
    signing_reload_s: float = Field(default=10.0, ge=0.0, le=3600.0)
    #: RocksDB's memory for the label join's pending decisions, in MB: one memtable (two at
    #: most) and the read cache (`streams.agents.pending.DiskSettings`, whose defaults these
    #: are). They bound the process's RSS whatever the decision rate.
    pending_write_buffer_mb: int = Field(default=16, ge=1, le=1024)
    pending_block_cache_mb: int = Field(default=32, ge=1, le=65536)

    #: 1: a scope's telemetry is keyed by scope, and the one process owning its partition
    #: reads all of it. 2: workers key their reports by replica (``telemetry_key =
    #: "replica"``), so a region's reports spread over every partition; each process sums
    #: what it reads per scope and period (the first stage, ``streams.control.shards``) and
    #: the scope's owner merges the parts and runs the controller (``streams.control.gate``).
    stages: int = Field(default=1, ge=1, le=2)
    #: Two stages: how long past its end a period waits for a silent shard's part before it
    #: closes on the parts there are (each such close is counted).
    stage_grace_s: float = Field(default=1.0, ge=0.05, le=60.0)

    @field_validator("signing_key_file")
    @classmethod
    def _readable_key(cls, path: Path | None) -> Path | None:
        if path is not None:
            from schemas.signing import load_keyring

            load_keyring(path)  # ValueError names the file; pydantic names the key
        return path

    @model_validator(mode="after")
    def _one_key(self) -> ControlPlaneSettings:
        if self.signing_key is not None and self.signing_key_file is not None:
            raise ValueError("give signing_key or signing_key_file, not both")
        if self.signing_key is not None and not self.signing_key.get_secret_value():
            raise ValueError("signing_key must not be empty")
        return self

    def keys(self) -> KeySource | None:
        """The keyring to sign targets with and check inputs against, or None when signing is
        off. Read now: raises ValueError naming the file when it cannot be built."""
        from schemas.signing import Keyring, KeySource

        if self.signing_key is not None:
            return KeySource.fixed(Keyring.of(self.signing_key.get_secret_value()))
        if self.signing_key_file is not None:
            return KeySource(self.signing_key_file)
        return None
