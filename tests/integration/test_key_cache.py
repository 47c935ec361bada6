"""The API's per-process cache of looked-up keys: a hit skips the database,
an entry expires after its TTL, and a revocation made elsewhere takes
effect within that TTL (at once through the same KeyStore)."""

from __future__ import annotations

import time

from runlane.keys import KeyStore, Principal
from runlane.store import RunStore
from tests.support import wait_until


def prefix_of(secret: str) -> str:
    return secret[: secret.index("_", 3)]


async def test_a_cached_key_skips_the_lookup_until_its_ttl_ends(store: RunStore) -> None:
    keys = KeyStore(store.pool, cache_seconds=0.3)
    _, secret = await keys.create(tenant="acme", user_id="ann")
    ann = Principal("acme", "ann", False)
    assert await keys.authenticate(secret) == ann
    assert await keys.authenticate(secret) == ann
    assert keys.lookups == 1
    # Once the entry expired, the key is looked up again.
    await wait_until(
        lambda: _authenticated_with_lookup(keys, secret, 2), timeout=5, message="a second lookup"
    )


async def test_a_key_revoked_elsewhere_stops_working_within_the_ttl(store: RunStore) -> None:
    api = KeyStore(store.pool, cache_seconds=1.0)
    cli = KeyStore(store.pool)  # another process, say `runlane keys revoke`
    _, secret = await cli.create(tenant="acme", user_id="ann")
    assert await api.authenticate(secret) is not None
    revoked = time.monotonic()
    await cli.revoke(prefix_of(secret))
    await wait_until(lambda: _refused(api, secret), timeout=10, message="the revoked key refused")
    assert time.monotonic() - revoked < 1.0 + 2  # the TTL, plus a slow machine
    assert await api.authenticate(secret) is None


async def test_revoking_through_the_same_store_is_immediate(store: RunStore) -> None:
    keys = KeyStore(store.pool, cache_seconds=60)
    _, secret = await keys.create(tenant="acme", user_id="ann")
    assert await keys.authenticate(secret) is not None
    await keys.revoke(prefix_of(secret))
    assert await keys.authenticate(secret) is None


async def test_unknown_keys_are_never_cached(store: RunStore) -> None:
    keys = KeyStore(store.pool, cache_seconds=60)
    unknown = "rl_00000000_" + "a" * 43
    assert await keys.authenticate(unknown) is None
    assert await keys.authenticate(unknown) is None
    assert keys.lookups == 2


async def test_without_a_ttl_every_call_looks_up(store: RunStore) -> None:
    keys = KeyStore(store.pool)
    _, secret = await keys.create(tenant="acme", user_id="ann")
    for _ in range(3):
        assert await keys.authenticate(secret) is not None
    assert keys.lookups == 3


async def _authenticated_with_lookup(keys: KeyStore, secret: str, lookups: int) -> bool:
    return await keys.authenticate(secret) is not None and keys.lookups >= lookups


async def _refused(keys: KeyStore, secret: str) -> bool:
    return await keys.authenticate(secret) is None
