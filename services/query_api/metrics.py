"""Prometheus metrics of the query API (docs/metrics.md, "Query API"), the ASGI middleware that
counts every HTTP request by route template, and the reading of the snapshot it serves."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.routing import BaseRoute, Match, Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.query_api.schemas import QueryResponse

QUERY_REQUESTS = Counter(
    "kgstream_query_requests_total",
    "Queries answered, by mode used and HTTP status",
    ["mode", "status"],
)
QUERY_SECONDS = Histogram(
    "kgstream_query_seconds",
    "Latency of answered queries, by mode used",
    ["mode"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30),
)
QUERY_CONTEXTS = Histogram(
    "kgstream_query_contexts",
    "Contexts returned per query, by mode used",
    ["mode"],
    buckets=(0, 1, 2, 3, 5, 10, 20, 50),
)
QUERY_SNAPSHOT = Gauge(
    "kgstream_query_snapshot_id", "The community snapshot the API serves (0 = none)"
)
HTTP_REQUESTS = Counter(
    "kgstream_http_requests_total",
    "HTTP requests, by route template, method and status",
    ["route", "method", "status"],
)
HTTP_SECONDS = Histogram(
    "kgstream_http_request_seconds",
    "HTTP request latency, by route template and method",
    ["route", "method"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
REJECTED = Counter("kgstream_api_rejected_total", "Requests refused by a limit", ["limit"])
UNMATCHED = "unmatched"  # the route label of a path no route serves (bounded cardinality)


def observe_query(resp: QueryResponse) -> None:
    """An answered query (200)."""
    mode = resp.mode_used
    QUERY_REQUESTS.labels(mode=mode, status="200").inc()
    QUERY_SECONDS.labels(mode=mode).observe(resp.timings.get("total_ms", 0.0) / 1000)
    QUERY_CONTEXTS.labels(mode=mode).observe(len(resp.contexts))
    QUERY_SNAPSHOT.set(resp.snapshot_id or 0)


def observe_failed_query(mode: str, status: int) -> None:
    """A query that ended in an error status (the requested mode: none was used)."""
    QUERY_REQUESTS.labels(mode=mode, status=str(status)).inc()


async def refresh_snapshot(engine: AsyncEngine) -> None:
    """Set the snapshot gauge to the published snapshot (what the next query reads)."""
    async with engine.connect() as conn:
        found = await conn.scalar(text("SELECT id FROM snapshots WHERE status = 'published'"))
    QUERY_SNAPSHOT.set(int(found or 0))


class HttpMetrics:
    """Counts and times every HTTP request by its route template (``/v1/entities/{entity_id}``),
    including the ones a limit refuses before routing. Outermost middleware."""

    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app, self.routes = app, router.routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            route, method = self.template(scope), scope["method"]
            HTTP_REQUESTS.labels(route=route, method=method, status=str(status)).inc()
            HTTP_SECONDS.labels(route=route, method=method).observe(time.perf_counter() - start)

    def template(self, scope: Scope) -> str:
        """The path template of the route that serves ``scope``, or UNMATCHED."""
        routed = scope.get("route")
        if isinstance(routed, Route):
            return routed.path
        for route in self.routes:
            if _matches(route, scope) and isinstance(route, Route):
                return route.path
        return UNMATCHED


def _matches(route: BaseRoute, scope: Scope) -> bool:
    match, _ = route.matches(scope)
    return match == Match.FULL
