"""Limits that protect the API process: request body size and type (413, 415), per-query bounds
from settings (422), and admission control with a time budget for every route that reads the
database or the models (429, 504; overall and per key), which a request reaches only with its
whole body in (408 beyond the body timeout). All answered as problem+json; the middlewares are
pure ASGI, and a body is buffered only once its size and type have passed their checks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from services.core.access import Caller
from services.core.cloudevents import is_json_media_type
from services.core.settings import Settings
from services.query_api.auth import PRINCIPAL_STATE, Principal, Unauthorized
from services.query_api.metrics import REJECTED
from services.query_api.problems import RETRY_AFTER_S, Problem, ProblemResponse, problem
from services.retrieval.schemas import QueryRequest

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
                    detail = self._too_large(received, streamed=True)
                    raise Problem(413, "Content Too Large", detail)
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
    (429 with Retry-After beyond either, never queued), each within ``timeout_s`` (504).

    A request takes its place only once its whole body is in (``Bodies``: within
    ``body_timeout_s``, 408 beyond it), so a caller that sends its headers and then nothing,
    or a byte now and then, never holds a place another caller needs: it holds a connection
    and a place among the requests waiting for their bodies, which a newcomer takes from it
    when they are all taken (issue 30, finding 3). Likewise the place is given back once the
    app has made its response, before it is sent: a caller that reads nothing holds a
    connection, never a place.

    The caller is authenticated first, before its request may wait for anything (its body
    included): a malformed, unknown or revoked key is 401 at once, and so is a missing one
    where keys are required, except on GET and HEAD (open pages; the routes that need a key
    refuse it themselves). The share is counted per key id, however the header was spelled.
    Anonymous requests are bound by ``max_concurrent`` alone: local callers cannot be told
    apart (they all have one address)."""

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
        max_waiting_bodies: int,
    ) -> None:
        self.app, self.exempt, self.authenticate = app, frozenset(exempt), authenticate
        self.max_concurrent, self.timeout_s = max_concurrent, timeout_s
        self.per_key = min(per_key, max_concurrent)
        self.bodies = Bodies(max_waiting_bodies, body_timeout_s)
        self.in_flight = 0
        self.by_key: dict[int, int] = {}  # API key id -> requests running

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        if (refusal := self._refusal(None)) is not None:
            await self._too_many(refusal, scope, receive, send)
            return
        # A place is taken while the key is looked up, so lookups of unknown keys (one query
        # each; verified keys are cached) are bounded like everything else; it is given back
        # before a refusal is sent or the body is waited for.
        with self._place(None):
            principal = await self._principal(scope)
        if not isinstance(principal, Principal):
            await principal(scope, receive, send)
            return
        body = await self._body(principal, scope, receive, send)
        if body is None:
            return
        with self._place(principal.key.id if principal.key is not None else None) as release:
            await self._timed(scope, replayed(body, receive), send, release)

    @contextmanager
    def _place(self, key: int | None) -> Iterator[Callable[[], None]]:
        """A place (and one of ``key``'s share) held until the block ends or the function it
        yields is called, whichever comes first."""
        self.in_flight += 1
        if key is not None:
            self.by_key[key] = self.by_key.get(key, 0) + 1
        held = True

        def release() -> None:
            nonlocal held
            if not held:
                return
            held = False
            self.in_flight -= 1
            if key is not None:
                self.by_key[key] -= 1
                if not self.by_key[key]:
                    del self.by_key[key]

        try:
            yield release
        finally:
            release()

    async def _body(
        self, principal: Principal, scope: Scope, receive: Receive, send: Send
    ) -> bytes | None:
        """The whole body, once it is in and there is a place for it; None when the request
        was answered here (429, or 408 or 413 from ``Bodies``) or the client left."""
        # Refused now, the body would be read in vain; asked again once it is in.
        if (refusal := self._refusal(principal)) is not None:
            await self._too_many(refusal, scope, receive, send)
            return None
        body = await self.bodies.read(scope, receive, send)
        if body is None:
            return None
        if (refusal := self._refusal(principal)) is not None:
            await self._too_many(refusal, scope, receive, send)
            return None
        return body

    def _refusal(self, principal: Principal | None) -> str | None:
        """Why a request of ``principal`` (None: not known yet) cannot have a place now."""
        if self.in_flight >= self.max_concurrent:
            return (
                f"{self.in_flight} requests are running; the limit is {self.max_concurrent} "
                "(KGSTREAM_QUERY_MAX_CONCURRENT)"
            )
        if principal is None or principal.key is None:
            return None  # anonymous: bound by max_concurrent alone
        running = self.by_key.get(principal.key.id, 0)
        if running < self.per_key:
            return None
        return (
            f"{running} requests with this key are running; the limit per key is "
            f"{self.per_key} (KGSTREAM_QUERY_MAX_CONCURRENT_PER_KEY)"
        )

    async def _principal(self, scope: Scope) -> Principal | ProblemResponse:
        """The request's principal, or the refusal to answer it with (401, 503)."""
        authorization = Headers(scope=scope).get("authorization")
        try:
            principal = await self.authenticate(authorization)
        except Unauthorized as exc:
            if authorization is None and scope["method"] in _BODILESS_METHODS:
                # Open pages (/dashboard, /docs); a GET that needs a key is refused by its
                # route.
                return _NO_KEY
            challenge = {"WWW-Authenticate": exc.challenge}
            return problem(401, exc.title, exc.detail, scope["path"], challenge)
        except SQLAlchemyError as exc:
            retry = {"Retry-After": str(RETRY_AFTER_S)}
            detail = f"could not look up the API key: {type(exc).__name__}"
            return problem(503, "Database unavailable", detail, scope["path"], retry)
        scope.setdefault("state", {})[PRINCIPAL_STATE] = principal  # for the route's checks
        return principal

    async def _too_many(self, detail: str, scope: Scope, receive: Receive, send: Send) -> None:
        REJECTED.labels(limit="Too Many Requests").inc()
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        await problem(429, "Too Many Requests", detail, scope["path"], retry)(scope, receive, send)

    async def _timed(
        self, scope: Scope, receive: Receive, send: Send, release: Callable[[], None]
    ) -> None:
        # The response is held back until the app has made all of it, and the place is given
        # back before it is sent: a caller that does not read its responses (pipelining
        # requests on one connection until the server's send buffers are full) holds a
        # connection, never a place. Responses are whole in memory anyway (JSON, and static
        # files below 64 KiB); a streaming route would have to be exempt.
        response: list[AsgiMessage] = []
        delivering = False

        async def deliver() -> None:
            nonlocal delivering
            release()
            delivering = True
            while response:
                await send(response.pop(0))

        async def held(message: AsgiMessage) -> None:
            response.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await deliver()

        try:
            async with asyncio.timeout(self.timeout_s):  # the work and the delivery
                await self.app(scope, receive, held)
                await deliver()  # what the app left unfinished, if anything (the server ends it)
        except TimeoutError:
            if delivering:  # too late for a problem document: the client sees a cut response
                raise
            REJECTED.labels(limit="Gateway Timeout").inc()
            release()  # the work has stopped
            detail = f"the request took longer than {self.timeout_s:g} s (KGSTREAM_QUERY_TIMEOUT_S)"
            await problem(504, "Request timed out", detail, scope["path"])(scope, receive, send)


class _Waiting:
    """A request waiting for its body: when its last bytes came, and the timeout that ends its
    wait (moved to now when a newcomer needs its place)."""

    __slots__ = ("dropped", "last", "timeout")

    def __init__(self, now: float, timeout: asyncio.Timeout) -> None:
        self.last, self.timeout, self.dropped = now, timeout, False


class Bodies:
    """Whole request bodies, read before admission: each within ``timeout_s`` of the start of
    its wait (408 beyond it), at most ``max_waiting`` waits at once. The bound is kept by
    dropping, not by refusing: a request that finds ``max_waiting`` others waiting takes the
    place of the one that has gone longest without sending a byte (408 for that one), so
    callers that send nothing cannot keep out one that sends its body. It bounds the memory
    bodies take before their requests are admitted (``max_waiting`` times
    KGSTREAM_API_MAX_BODY_BYTES at most) and the tasks waiting for them; a waiting request
    costs no database or model work."""

    def __init__(self, max_waiting: int, timeout_s: float) -> None:
        self.max_waiting, self.timeout_s = max_waiting, timeout_s
        self.waiting: set[_Waiting] = set()

    async def read(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The body; None when the request was answered here (408, or a refusal of BodyLimits
        such as 413) or the client went away first."""
        body = await self._receive(scope, receive)
        if isinstance(body, ProblemResponse):
            await body(scope, receive, send)  # no longer counted among the waiting
            return None
        return body

    async def _receive(self, scope: Scope, receive: Receive) -> bytes | ProblemResponse | None:
        loop = asyncio.get_running_loop()
        chunks: list[bytes] = []
        waiting = None
        try:
            async with asyncio.timeout(self.timeout_s) as timeout:
                waiting = self._enter(_Waiting(loop.time(), timeout))
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return None  # http.disconnect
                    chunks.append(message.get("body", b""))
                    waiting.last = loop.time()
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            return self._timed_out(waiting is not None and waiting.dropped, scope["path"])
        except Problem as refused:  # BodyLimits, while the body streamed in
            return problem(refused.status, refused.title, refused.detail, scope["path"])
        finally:
            if waiting is not None:
                self.waiting.discard(waiting)

    def _enter(self, waiting: _Waiting) -> _Waiting:
        if len(self.waiting) >= self.max_waiting:
            idlest = min(self.waiting, key=lambda w: w.last)
            self.waiting.discard(idlest)
            if not idlest.timeout.expired():  # else it is on its way out already
                idlest.dropped = True
                idlest.timeout.reschedule(asyncio.get_running_loop().time())
        self.waiting.add(waiting)
        return waiting

    def _timed_out(self, dropped: bool, path: str) -> ProblemResponse:
        REJECTED.labels(limit="Request Timeout").inc()
        if dropped:
            detail = (
                f"the request body had not arrived when {self.max_waiting} requests were "
                "waiting for theirs and another came; the one idle longest gives way "
                "(KGSTREAM_API_MAX_WAITING_BODIES)"
            )
        else:
            detail = (
                f"the request body did not arrive within {self.timeout_s:g} s "
                "(KGSTREAM_API_BODY_TIMEOUT_S)"
            )
        return problem(408, "Request Timeout", detail, path)


def replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` for an app, once ``body`` (the whole body) has been read from it: the body
    in one message, then what ``receive`` says next (a disconnect)."""
    sent = False

    async def replay() -> AsgiMessage:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


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
