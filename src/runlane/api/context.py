"""What the API's routes share, built once per process."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from runlane.api.metrics import ApiMetrics
from runlane.event_hub import EventHub
from runlane.keys import KeyStore, Principal
from runlane.lane_service import LaneService
from runlane.service import RunService
from runlane.settings import Settings


@dataclass
class ApiContext:
    settings: Settings
    url: str
    pool: AsyncConnectionPool[AsyncConnection[DictRow]]
    runs: RunService
    lanes: LaneService
    keys: KeyStore
    hub: EventHub
    metrics: ApiMetrics
    # The agents a worker serves, when the API knows the registry; None
    # means any agent name is accepted (an unknown one fails at the worker).
    agents: frozenset[str] | None
    keepalive_seconds: float


def owner_filter(who: Principal) -> str | None:
    """Admins see every user of their tenant; others only themselves."""
    return None if who.admin else who.user_id
