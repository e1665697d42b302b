"""Who a request runs as: API keys (``Authorization: Bearer KEY``), the auth mode, and the
scope each route needs. Routes declare ``dependencies=[QUERY]`` (or INGEST, ADMIN) and read the
caller through ``CallerDep``; /healthz, /readyz and /metrics declare nothing and stay open."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.access import Caller
from services.core.api_keys import SCOPES, ApiKey, verify_key
from services.core.errors import ConfigurationError
from services.core.settings import Settings
from services.query_api.problems import Problem, problem_response

log = logging.getLogger(__name__)
_CACHE_MAX = 10_000
PRINCIPAL_STATE = "principal"  # request.state key: set where admission authenticated already


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost; anything else (0.0.0.0, a name) may be reachable."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def keys_required(settings: Settings) -> bool:
    """KGSTREAM_AUTH after resolving auto against the bind address."""
    if settings.auth == "auto":
        return not is_loopback(settings.api_host)
    return settings.auth == "required"


def check_bind(settings: Settings) -> None:
    """Refuse to serve without keys where other machines may reach the API, unless forced."""
    exposed = not is_loopback(settings.api_host)
    if settings.auth == "off" and exposed and not settings.auth_allow_insecure:
        raise ConfigurationError(
            f"refusing to start the query API on {settings.api_host} with KGSTREAM_AUTH=off:"
            " anyone who reaches it could query, ingest and delete. Bind a loopback address,"
            " use KGSTREAM_AUTH=auto or required (create keys with `kgstream keys create`),"
            " or set KGSTREAM_AUTH_ALLOW_INSECURE=true"
        )


def docs_enabled(settings: Settings) -> bool:
    """Whether /docs, /redoc and /openapi.json are served (KGSTREAM_API_DOCS)."""
    if settings.api_docs == "auto":
        return not keys_required(settings)
    return settings.api_docs == "on"


class Unauthorized(Problem):
    """401: no usable key. Answered with ``WWW-Authenticate: Bearer`` (RFC 6750)."""

    def __init__(self, detail: str, *, invalid: bool) -> None:
        super().__init__(401, "Unauthorized", detail)
        error = ', error="invalid_token"' if invalid else ""
        self.challenge = f'Bearer realm="kgstream"{error}'


@dataclass(frozen=True)
class Principal:
    """The authenticated side of a request: its caller and what it may call."""

    caller: Caller
    key: ApiKey | None  # None: anonymous, only when keys are not required

    def allows(self, scope: str) -> bool:
        return self.key is None or self.key.allows(scope)


class Authenticator:
    """Verifies keys against the database, remembering live ones for ``ttl`` seconds (only
    hashes of keys are held; unknown keys are not remembered, so guessing fills nothing)."""

    def __init__(self, engine: AsyncEngine, required: bool, ttl: float) -> None:
        self.engine, self.required, self.ttl = engine, required, ttl
        self._cache: dict[bytes, tuple[float, ApiKey]] = {}

    async def principal(self, authorization: str | None) -> Principal:
        """The request's principal from its Authorization header, else Unauthorized."""
        if authorization is None:
            if self.required:
                detail = "an API key is required: Authorization: Bearer KEY"
                raise Unauthorized(detail, invalid=False)
            return Principal(Caller(), None)
        scheme, _, token = authorization.strip().partition(" ")
        key = await self._verify(token.strip()) if scheme.lower() == "bearer" else None
        if key is None:
            raise Unauthorized("the API key is malformed, unknown or revoked", invalid=True)
        return Principal(key.caller(), key)

    async def _verify(self, token: str) -> ApiKey | None:
        digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        key = await verify_key(self.engine, token)
        if key is not None and self.ttl > 0:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[digest] = (now + self.ttl, key)
        return key


async def authenticate(request: Request) -> Principal:
    """The request's principal (FastAPI runs this once per request however often it is used;
    admission, limits.py, has usually found it already)."""
    known: Principal | None = getattr(request.state, PRINCIPAL_STATE, None)
    if known is not None:
        return known
    authenticator: Authenticator = request.app.state.authenticator
    return await authenticator.principal(request.headers.get("authorization"))


def require(scope: str) -> Callable[[Principal], Awaitable[None]]:
    """A dependency that answers 403 unless the caller's key has ``scope``."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def check(principal: Annotated[Principal, Depends(authenticate)]) -> None:
        if not principal.allows(scope):
            raise Problem(403, "Forbidden", f"this API key lacks the {scope!r} scope")

    check.__name__ = f"require_{scope}"
    return check


QUERY = Depends(require("query"))
INGEST = Depends(require("ingest"))
ADMIN = Depends(require("admin"))


def get_caller(principal: Annotated[Principal, Depends(authenticate)]) -> Caller:
    """Who the request runs as: the key's caller, or an anonymous ``Caller()`` (no tenant, no
    groups, not admin) when keys are not required and none was sent."""
    return principal.caller


CallerDep = Annotated[Caller, Depends(get_caller)]


def install(app: FastAPI, settings: Settings, engine: AsyncEngine) -> None:
    """Put the authenticator on the app, answer 401s with their challenge, and say so loudly
    when requests are served without keys."""
    required = keys_required(settings)
    app.state.authenticator = Authenticator(engine, required, settings.auth_cache_ttl_s)

    @app.exception_handler(Unauthorized)
    async def _unauthorized(request: Request, exc: Unauthorized) -> JSONResponse:
        response = problem_response(request, 401, exc.title, exc.detail)
        response.headers["WWW-Authenticate"] = exc.challenge
        return response

    if not required:
        log.warning(
            "authentication is off (KGSTREAM_AUTH=%s, API on %s): requests without a key run as"
            " an anonymous caller and may query and ingest",
            settings.auth,
            settings.api_host,
        )
