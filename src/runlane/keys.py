"""API keys: bearer keys that map to (tenant, user, role).

A key is shown once, when created; only its sha256 is stored. Keys are 32
random bytes, so a fast hash is enough (nothing to brute-force).

With ``cache_seconds`` (the API's ``RUNLANE_API_KEY_CACHE_SECONDS``), a key
found valid is trusted for that long without asking the database again: a
key revoked by another process stops working within that time (one revoked
through this ``KeyStore`` stops at once). Unknown and revoked keys are
never cached.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from runlane.errors import InvalidInput, NotFound
from runlane.queries import named_queries

KEY_PREFIX = "rl_"
# Keys remembered at most per process (a bound, not a tuning knob).
CACHE_LIMIT = 10_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}$")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for."""

    tenant: str
    user_id: str
    admin: bool


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: UUID
    prefix: str
    tenant: str
    user_id: str
    admin: bool
    name: str | None
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ApiKey:
        return cls(**{name: row[name] for name in cls.__slots__})

    @property
    def principal(self) -> Principal:
        return Principal(self.tenant, self.user_id, self.admin)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    def __init__(
        self, pool: AsyncConnectionPool[AsyncConnection[DictRow]], *, cache_seconds: float = 0.0
    ) -> None:
        self.pool = pool
        self.cache_seconds = cache_seconds
        # key hash -> (monotonic expiry, principal)
        self._cache: dict[str, tuple[float, Principal]] = {}
        self.lookups = 0
        self._revokes = 0
        self._sql = named_queries("keys.sql")

    async def create(
        self, *, tenant: str, user_id: str, admin: bool = False, name: str | None = None
    ) -> tuple[ApiKey, str]:
        """Creates a key; returns it and the secret, which is never stored."""
        for label, value in (("tenant", tenant), ("user", user_id)):
            if not _NAME.match(value):
                raise InvalidInput(
                    f"{label} must be 1-128 letters, digits, '_', '.', '@', ':' or '-'"
                )
        public = secrets.token_hex(4)
        secret = f"{KEY_PREFIX}{public}_{secrets.token_urlsafe(32)}"
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self._sql["insert_key"],
                {
                    "prefix": f"{KEY_PREFIX}{public}",
                    "key_hash": hash_key(secret),
                    "tenant": tenant,
                    "user_id": user_id,
                    "admin": admin,
                    "name": name,
                },
            )
            row = await cur.fetchone()
        assert row is not None
        return ApiKey.from_row(row), secret

    async def authenticate(self, presented: str) -> Principal | None:
        """The principal of a valid, unrevoked key; None otherwise."""
        if not presented.startswith(KEY_PREFIX) or len(presented) > 200:
            return None
        key_hash = hash_key(presented)
        cached = self._cache.get(key_hash)
        if cached is not None:
            if cached[0] > time.monotonic():
                return cached[1]
            del self._cache[key_hash]
        self.lookups += 1
        # Both taken before the read: a revoke through this store while it
        # is in flight keeps the answer out of the cache, and the TTL runs
        # from before the database was asked.
        revokes, asked_at = self._revokes, time.monotonic()
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._sql["find_active_key"], {"key_hash": key_hash})
            row = await cur.fetchone()
        if row is None:
            return None
        principal = ApiKey.from_row(row).principal
        if self.cache_seconds > 0 and revokes == self._revokes:
            self._remember(key_hash, principal, asked_at)
        return principal

    def _remember(self, key_hash: str, principal: Principal, now: float) -> None:
        if len(self._cache) >= CACHE_LIMIT:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
        self._cache[key_hash] = (now + self.cache_seconds, principal)

    async def list(self, *, tenant: str | None = None) -> list[ApiKey]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._sql["list_keys"], {"tenant": tenant})
            return [ApiKey.from_row(row) for row in await cur.fetchall()]

    async def revoke(self, prefix: str) -> ApiKey:
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._sql["revoke_key"], {"prefix": prefix})
            row = await cur.fetchone()
        if row is None:
            raise NotFound(f"no key {prefix!r}")
        self._revokes += 1
        self._cache.pop(row["key_hash"], None)
        return ApiKey.from_row(row)
