from __future__ import annotations

import pytest
from pydantic import ValidationError

from runlane.settings import Settings


def test_defaults_match_the_documented_values(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "MAX_ATTEMPTS", "POLL_SECONDS"):
        monkeypatch.delenv(f"RUNLANE_{name}", raising=False)
    settings = Settings()
    assert (settings.lease_seconds, settings.heartbeat_seconds) == (45, 15)
    assert (settings.max_attempts, settings.poll_seconds) == (3, 1)


def test_values_come_from_runlane_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNLANE_LEASE_SECONDS", "60")
    monkeypatch.setenv("RUNLANE_MAX_ATTEMPTS", "7")
    monkeypatch.setenv("RUNLANE_DATABASE_URL", "postgresql://db/x")
    settings = Settings()
    assert settings.lease_seconds == 60 and settings.max_attempts == 7
    assert settings.database_url == "postgresql://db/x"


def test_a_heartbeat_longer_than_a_third_of_the_lease_is_refused() -> None:
    with pytest.raises(ValidationError, match="heartbeat_seconds"):
        Settings(lease_seconds=10, heartbeat_seconds=4)


def test_nonsense_values_are_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(max_attempts=0)
    with pytest.raises(ValidationError):
        Settings(lease_seconds=-1)
    with pytest.raises(ValidationError, match="gc_threshold"):
        Settings(gc_threshold=-1)
    with pytest.raises(ValidationError, match="prefetch_handler_seconds"):
        Settings(prefetch_handler_seconds=-0.5)


def test_claiming_ahead_is_on_for_short_handlers_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RUNLANE_PREFETCH_HANDLER_SECONDS", raising=False)
    assert Settings().prefetch_handler_seconds == 0.02
    monkeypatch.setenv("RUNLANE_PREFETCH_HANDLER_SECONDS", "0")
    assert Settings().prefetch_handler_seconds == 0


def test_the_api_key_cache_is_short_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNLANE_API_KEY_CACHE_SECONDS", raising=False)
    assert Settings().api_key_cache_seconds == 2
    monkeypatch.setenv("RUNLANE_API_KEY_CACHE_SECONDS", "0")
    assert Settings().api_key_cache_seconds == 0
    with pytest.raises(ValidationError):
        Settings(api_key_cache_seconds=-1)
