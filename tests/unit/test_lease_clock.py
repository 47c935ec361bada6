from __future__ import annotations

import time

from runlane.context import LeaseClock


def test_work_is_abandoned_before_the_lease_runs_out() -> None:
    clock = LeaseClock(lease_seconds=10)
    now = time.monotonic()
    clock.renewed(now)
    assert not clock.expired()
    # The watchdog gives up at 80% of the lease, counted from when the
    # renewal was sent (earlier than the database's own now()).
    assert clock.abandon_at == now + 8


def test_a_stale_renewal_never_moves_the_clock_back() -> None:
    clock = LeaseClock(lease_seconds=10)
    now = time.monotonic()
    clock.renewed(now)
    clock.renewed(now - 5)
    assert clock.abandon_at == now + 8


def test_a_lease_renewed_long_ago_has_expired() -> None:
    clock = LeaseClock(lease_seconds=1)
    clock.renewed(time.monotonic() - 1)
    assert clock.expired()
