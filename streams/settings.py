"""Settings of a control-plane process (not of the control laws: those are `ControlConfig`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.topics import SCOPE_PARTITIONS


class ControlPlaneSettings(BaseSettings):
    """Process-level knobs, from `SURPLUS_CONTROL_*` or flags; validated at start."""

    model_config = SettingsConfigDict(env_prefix="SURPLUS_CONTROL_", frozen=True, extra="forbid")

    app_id: str = Field(default="surplus-control", min_length=1)
    config_path: Path | None = None
    partitions: int = Field(default=SCOPE_PARTITIONS, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1, le=16)
    metrics_port: int = Field(default=0, ge=0, le=65535)
    data_dir: Path = Path(".surplus/control")
    loglevel: str = "warning"
