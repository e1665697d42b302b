"""Limits that protect the API process: request body size and type (413, 415), per-query bounds
from settings (422), and admission control with a time budget for queries (429, 504). All
answered as problem+json; the middlewares are pure ASGI so nothing is buffered before a check."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from email.message import Message
from typing import Annotated

from fastapi import Depends, Request
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from services.core.settings import Settings
from services.query_api.metrics import REJECTED
from services.query_api.problems import RETRY_AFTER_S, Problem, problem
from services.query_api.schemas import QueryRequest

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_json(content_type: str) -> bool:
    """application/json or any application/*+json media type (parameters ignored)."""
    message = Message()
    message["content-type"] = content_type
    main, _, sub = message.get_content_type().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


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
        if method in _BODY_METHODS and has_body and content_type and not is_json(content_type):
            detail = f"send application/json, not {content_type[:100]}"
            return Problem(415, "Unsupported Media Type", detail)
        return None

    def _too_large(self, size: int, *, streamed: bool = False) -> str:
        amount = f"more than {self.max_bytes}" if streamed else str(size)
        return (
            f"the request body is {amount} bytes; the limit is {self.max_bytes} "
            "(KGSTREAM_API_MAX_BODY_BYTES)"
        )


class QueryGate:
    """At most ``max_concurrent`` requests to ``paths`` at once (429 with Retry-After beyond,
    never queued), each within ``timeout_s`` (504)."""

    def __init__(
        self, app: ASGIApp, paths: Iterable[str], max_concurrent: int, timeout_s: float
    ) -> None:
        self.app, self.paths = app, frozenset(paths)
        self.max_concurrent, self.timeout_s = max_concurrent, timeout_s
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_concurrent:
            REJECTED.labels(limit="Too Many Requests").inc()
            detail = (
                f"{self.in_flight} queries are running; the limit is {self.max_concurrent} "
                "(KGSTREAM_QUERY_MAX_CONCURRENT)"
            )
            retry = {"Retry-After": str(RETRY_AFTER_S)}
            await problem(429, "Too Many Requests", detail, scope["path"], retry)(
                scope, receive, send
            )
            return
        started = False

        async def tracked(message: AsgiMessage) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        self.in_flight += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.app(scope, receive, tracked)
        except TimeoutError:
            if started:  # too late for a problem document: the client sees a cut response
                raise
            REJECTED.labels(limit="Gateway Timeout").inc()
            detail = f"the query took longer than {self.timeout_s:g} s (KGSTREAM_QUERY_TIMEOUT_S)"
            await problem(504, "Query timed out", detail, scope["path"])(scope, receive, send)
        finally:
            self.in_flight -= 1


def limited_query(req: QueryRequest, request: Request) -> QueryRequest:
    """The query request, within the bounds the settings set (422 otherwise)."""
    settings: Settings = request.app.state.settings
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


LimitedQuery = Annotated[QueryRequest, Depends(limited_query)]
