"""Settings read from ``RUNLANE_*`` environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Interrupted runs wait for a human and are never pruned.
PRUNABLE_STATUSES = ("completed", "failed", "dead", "cancelled")


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
    api_key_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        description="How long the HTTP API trusts an API key it looked up, per process; a key"
        " revoked elsewhere stops working within this long (0: look every key up).",
    )
    priority_aging_seconds: float = Field(
        default=10.0,
        ge=0,
        description="A pending run gains one priority point per this many seconds waited"
        " (0 turns aging off).",
    )
    retention_seconds: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="Finished runs older than this are pruned (with their attempts, events"
        " and effects).",
    )
    retention_by_status: dict[str, float] = Field(
        default_factory=dict,
        description='Per-status retention in seconds, as JSON: {"dead": 2592000}.',
    )
    pruner_interval_seconds: float = Field(default=60.0, gt=0)
    prefetch_handler_seconds: float = Field(
        default=0.02,
        ge=0,
        description="While its handlers' recent mean time is below this and runs are waiting,"
        " a worker claims ahead as many runs as its handler slots get through in this time (at"
        " least its concurrency, at most 200), each started as a handler slot frees, so that its"
        " next claim overlaps the handlers it runs; 0 turns this off.",
    )
    gc_threshold: int = Field(
        default=10_000,
        ge=0,
        description="A worker's or the HTTP API's process collects garbage after this many new"
        " objects (Python's default: 700), and at its first start moves what is loaded out of"
        " the collector's view (gc.freeze); 0 leaves Python's collector as it is.",
    )
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    cancel_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description="After a cancel reaches a handler, how long it may run before it is stopped.",
    )

    def retention(self) -> dict[str, float]:
        """Retention in seconds of each finished status that is pruned."""
        return {
            status: self.retention_by_status.get(status, self.retention_seconds)
            for status in PRUNABLE_STATUSES
        }

    @model_validator(mode="after")
    def _retention_statuses(self) -> Settings:
        unknown = set(self.retention_by_status) - set(PRUNABLE_STATUSES)
        if unknown:
            raise ValueError(
                f"retention_by_status: {sorted(unknown)} are not among {list(PRUNABLE_STATUSES)}"
            )
        return self

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
