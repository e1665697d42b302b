"""API keys: create (the plaintext is returned once), list, revoke, verify.

A key reads ``kgs_<lookup id>_<secret>``: 12 hex characters that find the row through a unique
index, then a 256-bit random secret (43 URL-safe base64 characters). Only SHA-256 of the secret
is stored; verifying is one indexed lookup and ``hmac.compare_digest`` of the hashes."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.access import Caller
from services.core.errors import KgstreamError

SCOPES = ("query", "ingest", "admin")
PREFIX = "kgs"
_KEY = re.compile(r"kgs_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_COLUMNS = "id, name, lookup_id, scopes, tenant, groups, created_at, revoked_at, last_used_at"
# last_used_at is a hint for operators, not an audit log: written at most once a minute per key
# so that verification stays a read on the hot path.
_TOUCH = text(
    "UPDATE api_keys SET last_used_at = now() WHERE id = :id"
    " AND (last_used_at IS NULL OR last_used_at < now() - interval '60 seconds')"
)


class ApiKeyError(KgstreamError):
    """A key operation cannot be done as asked (unknown id, unknown scope)."""


@dataclass(frozen=True)
class ApiKey:
    """One row of api_keys, without its hash."""

    id: int
    name: str
    lookup_id: str
    scopes: tuple[str, ...]
    tenant: str | None
    groups: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None

    def allows(self, scope: str) -> bool:
        """Admin implies every scope."""
        return "admin" in self.scopes or scope in self.scopes

    def caller(self) -> Caller:
        """Who a request with this key runs as."""
        if "admin" in self.scopes:
            return Caller(admin=True, key_id=self.id)
        return Caller(tenant=self.tenant, groups=frozenset(self.groups), key_id=self.id)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; there is no secret to leak."""
        out = dict(self.__dict__)
        out["scopes"], out["groups"] = list(self.scopes), list(self.groups)
        for name in ("created_at", "revoked_at", "last_used_at"):
            value = out[name]
            out[name] = value.isoformat() if value is not None else None
        return out


def parse_scopes(raw: str | Iterable[str]) -> tuple[str, ...]:
    """``"query,ingest"`` (or a list) as known scopes in canonical order, else ApiKeyError."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    chosen = {s.strip() for s in items if s.strip()}
    unknown = sorted(chosen - set(SCOPES))
    if unknown or not chosen:
        raise ApiKeyError(f"unknown scope(s) {unknown or [raw]}: choose from {', '.join(SCOPES)}")
    return tuple(s for s in SCOPES if s in chosen)


def hash_secret(secret: str) -> bytes:
    """SHA-256: the secret is 256 random bits, so no key stretching is needed (migration 0004)."""
    return hashlib.sha256(secret.encode("ascii")).digest()


def new_key() -> tuple[str, str, bytes]:
    """(the key, its lookup id, the hash of its secret)."""
    lookup, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return f"{PREFIX}_{lookup}_{secret}", lookup, hash_secret(secret)


def split_key(key: str) -> tuple[str, str] | None:
    """(lookup id, secret) of a well-formed key, else None."""
    match = _KEY.fullmatch(key)
    return (match.group(1), match.group(2)) if match else None


def _row(r: Any) -> ApiKey:
    return ApiKey(
        id=int(r.id),
        name=str(r.name),
        lookup_id=str(r.lookup_id),
        scopes=tuple(r.scopes),
        tenant=r.tenant,
        groups=tuple(r.groups),
        created_at=r.created_at,
        revoked_at=r.revoked_at,
        last_used_at=r.last_used_at,
    )


async def create_key(
    engine: AsyncEngine,
    scopes: Iterable[str],
    *,
    tenant: str | None = None,
    groups: Iterable[str] = (),
    name: str = "",
) -> tuple[ApiKey, str]:
    """Store a new key; returns it with its plaintext, which is never available again."""
    key, lookup, digest = new_key()
    params = {
        "name": name,
        "lookup": lookup,
        "hash": digest,
        "scopes": list(parse_scopes(scopes)),
        "tenant": tenant or None,
        "groups": sorted({g.strip() for g in groups if g.strip()}),
    }
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                text(
                    "INSERT INTO api_keys (name, lookup_id, secret_hash, scopes, tenant, groups)"  # noqa: S608 - _COLUMNS is a constant
                    " VALUES (:name, :lookup, :hash, :scopes, :tenant, :groups)"
                    f" RETURNING {_COLUMNS}"
                ),
                params,
            )
        ).one()
    return _row(row), key


async def list_keys(engine: AsyncEngine) -> list[ApiKey]:
    """Every key, revoked ones included, oldest first."""
    async with engine.connect() as conn:
        rows = await conn.execute(text(f"SELECT {_COLUMNS} FROM api_keys ORDER BY id"))  # noqa: S608 - _COLUMNS is a constant
        return [_row(r) for r in rows.all()]


async def revoke_key(engine: AsyncEngine, key_id: int) -> ApiKey:
    """Revoke a key (a second revoke keeps the first time); ApiKeyError for an unknown id."""
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                text(
                    "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = :id"  # noqa: S608 - _COLUMNS is a constant
                    f" RETURNING {_COLUMNS}"
                ),
                {"id": key_id},
            )
        ).one_or_none()
    if row is None:
        raise ApiKeyError(f"no API key has id {key_id}")
    return _row(row)


async def verify_key(engine: AsyncEngine, key: str) -> ApiKey | None:
    """The live key this plaintext belongs to, else None (malformed, unknown or revoked)."""
    parts = split_key(key)
    if parts is None:
        return None
    lookup, secret = parts
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                text(
                    f"SELECT {_COLUMNS}, secret_hash FROM api_keys"  # noqa: S608 - _COLUMNS is a constant
                    " WHERE lookup_id = :lookup AND revoked_at IS NULL"
                ),
                {"lookup": lookup},
            )
        ).one_or_none()
        if row is None or not hmac.compare_digest(bytes(row.secret_hash), hash_secret(secret)):
            return None
        await conn.execute(_TOUCH, {"id": row.id})
    return _row(row)
