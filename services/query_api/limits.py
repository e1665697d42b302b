"""Limits that protect the API process: request body size and type (413, 415), per-query bounds
from settings (422), and admission control with a time budget for every route that reads the
database or the models (429, 504; overall and per key). All answered as problem+json; the
middlewares are pure ASGI so nothing is buffered before a check."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from services.core.access import Caller
from services.core.cloudevents import is_json_media_type
from services.core.settings import Settings
from services.query_api.auth import PRINCIPAL_STATE, Principal, Unauthorized
from services.query_api.metrics import REJECTED
from services.query_api.problems import RETRY_AFTER_S, Problem, problem
from services.query_api.schemas import QueryRequest

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_BODILESS_METHODS = frozenset({"GET", "HEAD"})
_NO_KEY = Principal(Caller(), None)  # anonymous at admission; the route still checks


class BodyLimits:
    """Refuse a body over ``max_bytes`` (by Content-Length, or while it streams in: 413) and a
    body that is not JSON (415), before any route reads it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope["method"], headers)
        if refusal is not None:
            REJECTED.labels(limit=refusal.title).inc()
            await problem(refusal.status, refusal.title, refusal.detail, scope["path"])(
                scope, receive, send
            )
            return
        received = 0

        async def counted() -> AsgiMessage:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    REJECTED.labels(limit="Content Too Large").inc()
                    raise HTTPException(413, self._too_large(received, streamed=True))
            return message

        await self.app(scope, counted, send)

    def _refusal(self, method: str, headers: Headers) -> Problem | None:
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return Problem(400, "Bad Request", "Content-Length is not a number")
            if int(length) > self.max_bytes:
                return Problem(413, "Content Too Large", self._too_large(int(length)))
        has_body = (length is not None and length != "0") or "transfer-encoding" in headers
        content_type = headers.get("content-type")
        if (
            method in _BODY_METHODS
            and has_body
            and content_type
            and not is_json_media_type(content_type)
        ):
            detail = f"send application/json, not {content_type[:100]}"
            return Problem(415, "Unsupported Media Type", detail)
        return None

    def _too_large(self, size: int, *, streamed: bool = False) -> str:
        amount = f"more than {self.max_bytes}" if streamed else str(size)
        return (
            f"the request body is {amount} bytes; the limit is {self.max_bytes} "
            "(KGSTREAM_API_MAX_BODY_BYTES)"
        )


EXEMPT_PATHS = ("/healthz", "/readyz", "/metrics")  # probes and scrapes: never refused here


class Admission:
    """Admission control for every route but the ``exempt`` paths (probes and metrics): at
    most ``max_concurrent`` requests at once, at most ``per_key`` of them with one API key
    (429 with Retry-After beyond either, never queued), each within ``timeout_s`` (504) and
    with its body in within ``body_timeout_s`` (408).

    The caller is authenticated here, before its request may wait for anything (its body
    included): a malformed, unknown or revoked key is 401 at once, and so is a missing one
    where keys are required, except on GET and HEAD (open pages; the routes that need a key
    refuse it themselves, with no body to wait for). The share is counted per key id, however
    the header was spelled. Anonymous requests are bound by ``max_concurrent`` alone: local
    callers cannot be told apart (they all have one address)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        exempt: Iterable[str],
        authenticate: Callable[[str | None], Awaitable[Principal]],
        max_concurrent: int,
        per_key: int,
        timeout_s: float,
        body_timeout_s: float,
    ) -> None:
        self.app, self.exempt, self.authenticate = app, frozenset(exempt), authenticate
        self.max_concurrent, self.timeout_s = max_concurrent, timeout_s
        self.body_timeout_s = body_timeout_s
        self.per_key = min(per_key, max_concurrent)
        self.in_flight = 0
        self.by_key: dict[int, int] = {}  # API key id -> requests running

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_concurrent:
            detail = (
                f"{self.in_flight} requests are running; the limit is {self.max_concurrent} "
                "(KGSTREAM_QUERY_MAX_CONCURRENT)"
            )
            await self._too_many(detail, scope, receive, send)
            return
        # The place is taken while the key is looked up, so lookups of unknown keys (one
        # query each; verified keys are cached) are bounded like everything else.
        self.in_flight += 1
        try:
            principal = await self._principal(scope, receive, send)
            if principal is None:
                return
            await self._admit(principal, scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _principal(self, scope: Scope, receive: Receive, send: Send) -> Principal | None:
        authorization = Headers(scope=scope).get("authorization")
        try:
            principal = await self.authenticate(authorization)
        except Unauthorized as exc:
            if authorization is None and scope["method"] in _BODILESS_METHODS:
                # Open pages (/dashboard, /docs); a GET that needs a key is refused by its
                # route at once, having no body to wait for.
                return _NO_KEY
            challenge = {"WWW-Authenticate": exc.challenge}
            await problem(401, exc.title, exc.detail, scope["path"], challenge)(
                scope, receive, send
            )
            return None
        except SQLAlchemyError as exc:
            retry = {"Retry-After": str(RETRY_AFTER_S)}
            detail = f"could not look up the API key: {type(exc).__name__}"
            await problem(503, "Database unavailable", detail, scope["path"], retry)(
                scope, receive, send
            )
            return None
        scope.setdefault("state", {})[PRINCIPAL_STATE] = principal  # for the route's checks
        return principal

    async def _admit(
        self, principal: Principal, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if principal.key is None:
            await self._timed(scope, receive, send)
            return
        key = principal.key.id
        running = self.by_key.get(key, 0)
        if running >= self.per_key:
            detail = (
                f"{running} requests with this key are running; the limit per key is "
                f"{self.per_key} (KGSTREAM_QUERY_MAX_CONCURRENT_PER_KEY)"
            )
            await self._too_many(detail, scope, receive, send)
            return
        self.by_key[key] = running + 1
        try:
            await self._timed(scope, receive, send)
        finally:
            self.by_key[key] -= 1
            if not self.by_key[key]:
                del self.by_key[key]

    async def _too_many(self, detail: str, scope: Scope, receive: Receive, send: Send) -> None:
        REJECTED.labels(limit="Too Many Requests").inc()
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        await problem(429, "Too Many Requests", detail, scope["path"], retry)(scope, receive, send)

    async def _timed(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: AsgiMessage) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            async with asyncio.timeout(self.timeout_s):
                await self.app(scope, self._body_within(receive), tracked)
        except TimeoutError:
            if started:  # too late for a problem document: the client sees a cut response
                raise
            REJECTED.labels(limit="Gateway Timeout").inc()
            detail = f"the request took longer than {self.timeout_s:g} s (KGSTREAM_QUERY_TIMEOUT_S)"
            await problem(504, "Request timed out", detail, scope["path"])(scope, receive, send)

    def _body_within(self, receive: Receive) -> Receive:
        # The whole body has body_timeout_s from admission, so a client that sends its headers
        # and then nothing (or a byte now and then) gives its place back quickly. Once the body
        # is in, receive() is left unbounded: it then only waits for a disconnect.
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        complete = False

        async def bounded() -> AsgiMessage:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                REJECTED.labels(limit="Request Timeout").inc()
                detail = (
                    f"the request body did not arrive within {self.body_timeout_s:g} s "
                    "(KGSTREAM_API_BODY_TIMEOUT_S)"
                )
                raise HTTPException(408, detail) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        return bounded


def within_limits(req: QueryRequest, settings: Settings) -> QueryRequest:
    """The query request, within the bounds the settings set (a 422 Problem otherwise)."""
    errors = []
    if len(req.question) > settings.query_max_question_chars:
        limit = settings.query_max_question_chars
        message = f"{len(req.question)} characters; the limit is {limit}"
        errors.append({"field": "question", "message": message})
    if req.k > settings.query_max_k and "k" not in req.model_fields_set:
        req = req.model_copy(update={"k": settings.query_max_k})  # a default above the bound
    if req.k > settings.query_max_k:
        errors.append({"field": "k", "message": f"{req.k}; the limit is {settings.query_max_k}"})
    if errors:
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise Problem(422, "Invalid request", detail, errors=errors)
    return req


def limited_query(req: QueryRequest, request: Request) -> QueryRequest:
    """``within_limits`` as a FastAPI dependency: a body beyond the bounds is refused before
    the route runs."""
    return within_limits(req, request.app.state.settings)


LimitedQuery = Annotated[QueryRequest, Depends(limited_query)]
