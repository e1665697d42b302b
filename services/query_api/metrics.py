"""Prometheus metrics of the query API (docs/metrics.md, "Query API"), the ASGI middleware that
counts every HTTP request by route template, and the reading of the snapshot it serves."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.routing import BaseRoute, Match, Mount, Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.retrieval.monitoring import PathWindow, PatternLabels
from services.retrieval.schemas import QueryResponse

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
OUTBOX_FAILURES = Counter(
    "kgstream_ingest_outbox_failures_total",
    "Accepted ingest batches the database did not keep for a broker loss (still accepted: the "
    "broker had them)",
)
# Retrieval monitoring (issue 21; services/retrieval/monitoring.py, docs/curation.md).
QUERY_PATHS = Counter(
    "kgstream_query_paths_total",
    "Answered queries by path pattern (mode, hops, relation types; at most 64 names a process,"
    " then other)",
    ["pattern"],
)
QUERY_PATH_TOP_SHARE = Gauge(
    "kgstream_query_path_top_share",
    "Share of this process's answered queries of the last hour that took the most common path"
    " pattern (0 without queries)",
)
QUERY_ARMS = Counter(
    "kgstream_query_arms_total",
    "Answered queries by A/B arm (requested, routed, swapped) and mode used",
    ["arm", "mode"],
)
QUERY_FEEDBACK = Counter(
    "kgstream_query_feedback_total",
    "Verdicts on answers (POST /v1/feedback) by A/B arm, mode used and useful (true, false)",
    ["arm", "mode", "useful"],
)
_PATTERNS = PatternLabels()
_WINDOW = PathWindow()
# Read replicas (issue 20; services/retrieval/replicas.py). Targets and replicas are named
# primary and replica-<n> (the n-th URL of KGSTREAM_DATABASE_READ_URL): a bounded set.
READS = Counter(
    "kgstream_query_reads_total",
    "Read transactions of queries and graph reads, by database (primary, replica-<n>)",
    ["target"],
)
READ_FALLBACKS = Counter(
    "kgstream_query_read_fallbacks_total",
    "Reads sent to the primary although replicas are configured, by reason "
    "(no_usable_replica, not_caught_up)",
    ["reason"],
)
READ_WAITING = Gauge(
    "kgstream_query_read_waiting",
    "Reads waiting now for min_snapshot or after_event on a database, by target "
    "(primary, replica-<n>)",
    ["target"],
)
READ_WAIT_SECONDS = Histogram(
    "kgstream_query_read_wait_seconds",
    "Time reads with min_snapshot or after_event waited for their database, by outcome "
    "(met, refused)",
    ["outcome"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10),
)
REPLICA_LAG_BYTES = Gauge(
    "kgstream_replica_lag_bytes",
    "WAL the replica has not replayed (primary flush position - replay position; NaN unknown)",
    ["replica"],
)
REPLICA_LAG_SECONDS = Gauge(
    "kgstream_replica_lag_seconds",
    "Age of the newest transaction the replica shows, 0 when caught up (NaN unknown)",
    ["replica"],
)
REPLICA_USABLE = Gauge(
    "kgstream_replica_usable",
    "1 when reads may go to the replica (checked, answering, within KGSTREAM_READ_MAX_LAG_S)",
    ["replica"],
)
# Every label of the HTTP metrics comes from a bounded set: the middleware runs before auth,
# so anyone could otherwise add series (a random method each) until /metrics is megabytes.
UNMATCHED = "unmatched"  # the route label of a path no route serves
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"  # the method label of any other method, the status label outside 100-599


def observe_query(resp: QueryResponse) -> None:
    """An answered query (200)."""
    mode = resp.mode_used
    QUERY_REQUESTS.labels(mode=mode, status="200").inc()
    QUERY_SECONDS.labels(mode=mode).observe(resp.timings.get("total_ms", 0.0) / 1000)
    QUERY_CONTEXTS.labels(mode=mode).observe(len(resp.contexts))
    QUERY_SNAPSHOT.set(resp.snapshot_id or 0)
    QUERY_ARMS.labels(arm=resp.arm, mode=mode).inc()
    QUERY_PATHS.labels(pattern=_PATTERNS.label(resp.path_pattern)).inc()
    _WINDOW.add(resp.path_pattern)  # the raw pattern: "other" is many patterns, not one
    QUERY_PATH_TOP_SHARE.set(_WINDOW.top_share())


def observe_feedback(arm: str, mode: str, useful: bool) -> None:
    """A counted verdict on an answer."""
    QUERY_FEEDBACK.labels(arm=arm, mode=mode, useful=str(useful).lower()).inc()


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
        self.app, self.router = app, router

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
            route, method = self.template(scope), method_label(scope["method"])
            HTTP_REQUESTS.labels(route=route, method=method, status=status_label(status)).inc()
            HTTP_SECONDS.labels(route=route, method=method).observe(time.perf_counter() - start)

    def template(self, scope: Scope) -> str:
        """The path template of the route (or mount) that serves ``scope``, or UNMATCHED."""
        routed = scope.get("route")
        if isinstance(routed, Route | Mount):
            return routed.path
        for route in _served(self.router.routes):  # a request refused before routing
            if isinstance(route, Route | Mount) and _matches(route, scope):
                return route.path
        return UNMATCHED


def method_label(method: str) -> str:
    """The method, or OTHER for one outside METHODS (any token is a valid HTTP method)."""
    return method if method in METHODS else OTHER


def status_label(status: int) -> str:
    """The status code, or OTHER outside 100-599."""
    return str(status) if 100 <= status <= 599 else OTHER


def _served(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes, and those of included routers (FastAPI keeps an included router as one
    entry holding ``original_router``)."""
    for route in routes:
        yield route
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _served(included.routes)


def _matches(route: BaseRoute, scope: Scope) -> bool:
    match, _ = route.matches(scope)
    return match == Match.FULL


class PrometheusReadObserver:
    """The read router's events as the kgstream_query_read* and kgstream_replica_* series
    (services/retrieval/read_observer.py)."""

    def read(self, target: str) -> None:
        READS.labels(target=target).inc()

    def fallback(self, reason: str) -> None:
        READ_FALLBACKS.labels(reason=reason).inc()

    def waiting(self, target: str, delta: int) -> None:
        READ_WAITING.labels(target=target).inc(delta)

    def waited(self, outcome: str, seconds: float) -> None:
        READ_WAIT_SECONDS.labels(outcome=outcome).observe(seconds)

    def replica(
        self, name: str, *, usable: bool, lag_bytes: float | None, lag_s: float | None
    ) -> None:
        REPLICA_USABLE.labels(replica=name).set(1 if usable else 0)
        REPLICA_LAG_BYTES.labels(replica=name).set(math.nan if lag_bytes is None else lag_bytes)
        REPLICA_LAG_SECONDS.labels(replica=name).set(math.nan if lag_s is None else lag_s)
