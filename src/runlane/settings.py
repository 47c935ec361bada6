"""Settings read from ``RUNLANE_*`` environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "runlane"


class Settings(BaseSettings):
    """Every knob of runlane. Each field maps to ``RUNLANE_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="RUNLANE_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL. When unset, runlane starts an embedded server.",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Where the embedded PostgreSQL keeps its data.",
    )
    lease_seconds: float = Field(default=45.0, gt=0)
    heartbeat_seconds: float = Field(default=15.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    poll_seconds: float = Field(default=1.0, gt=0)
    reaper_interval_seconds: float = Field(default=10.0, gt=0)
    max_input_bytes: int = Field(default=1024 * 1024, gt=0)
    max_body_bytes: int = Field(
        default=1024 * 1024, gt=0, description="The HTTP API's cap on a request body."
    )
    priority_aging_seconds: float = Field(
        default=10.0,
        ge=0,
        description="A pending run gains one priority point per this many seconds waited"
        " (0 turns aging off).",
    )
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    cancel_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description="After a cancel reaches a handler, how long it may run before it is stopped.",
    )

    @model_validator(mode="after")
    def _heartbeat_within_lease(self) -> Settings:
        # Three renewals per lease: one slow or failed renewal must not
        # reach the watchdog's limit (80% of the lease).
        if self.heartbeat_seconds * 3 > self.lease_seconds:
            raise ValueError(
                "heartbeat_seconds must be at most a third of lease_seconds "
                f"(got heartbeat {self.heartbeat_seconds}s, lease {self.lease_seconds}s)"
            )
        return self
