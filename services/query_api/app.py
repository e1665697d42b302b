"""Query API process: the composition root for FastAPI. Builds the engine, models, the
QueryService and the document publisher once; routes.py translates HTTP to calls on them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.core.db.engine import check_schema
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.core.telemetry.models import PrometheusModelMeter
from services.core.telemetry.process import ProcessOps
from services.core.telemetry.server import url_host
from services.query_api import (
    auth,
    curation_routes,
    dashboard,
    explorer,
    mcp_server,
    problems,
    review_routes,
)
from services.query_api.heartbeat import Heartbeat
from services.query_api.ingest import DocumentPublisher
from services.query_api.limits import EXEMPT_PATHS, Admission, BodyLimits
from services.query_api.metrics import HttpMetrics, PrometheusReadObserver, refresh_snapshot
from services.query_api.operations import Operations
from services.query_api.probe_server import ProbeServer
from services.query_api.readiness import Readiness
from services.query_api.routes import router
from services.retrieval import compose
from services.retrieval.graph_holder import holding
from services.retrieval.monitoring import FeedbackLedger
from services.retrieval.replicas import measuring
from services.retrieval.service import QueryService

log = logging.getLogger(__name__)


def build_service(
    settings: Settings, database_url: str, *, replicas: bool = False, hold_graph: bool = False
) -> QueryService:
    """The query service of services/retrieval/compose.py with the API's metrics: model calls
    and reads reported to Prometheus."""
    return compose.build_service(
        settings,
        database_url,
        replicas=replicas,
        meter=PrometheusModelMeter(),
        observer=PrometheusReadObserver(),
        hold_graph=hold_graph,
    )


def create_app(
    settings: Settings, endpoints: Endpoints, service: QueryService | None = None
) -> FastAPI:
    """The FastAPI app; models load once at start-up (or come in ``service``). Refuses (a
    ConfigurationError) to serve without keys on a non-loopback address unless forced."""
    auth.check_bind(settings)
    svc = service or build_service(settings, endpoints.database_url, replicas=True, hold_graph=True)
    publisher = DocumentPublisher(
        endpoints.kafka_bootstrap_servers, settings.documents_topic, settings
    )
    # The probe reads the database the queries read, on a connection of its own.
    query_db = svc.engine.url.render_as_string(hide_password=False)
    readiness = Readiness(settings, query_db, endpoints.kafka_bootstrap_servers, svc.reads)

    # Registered in the processes table with the address of its own /metrics.
    ops = ProcessOps(
        svc.engine,
        "query-api",
        metrics_url=f"http://{url_host(settings.api_host)}:{settings.api_port}/metrics",
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await check_schema(svc.engine, settings.embedding_dim)
        await ops.start()
        probes = None
        heartbeat = Heartbeat(settings.api_loop_stall_s)
        ticking = asyncio.create_task(heartbeat.run(), name="kgstream-heartbeat")
        try:
            if settings.api_probe_port is not None:
                port = settings.api_probe_port
                probes = ProbeServer(readiness, heartbeat, settings.api_host, port)
                log.info("probes also on %s", await asyncio.to_thread(probes.start))
            # the replicas' lag is measured while serving (none is read before its first check)
            async with (
                dashboard.sampling(app),
                measuring(svc.reads),
                holding(svc.graph),
                mcp_server.running(app.state.mcp),
            ):
                yield
        finally:
            ticking.cancel()
            await ops.stop()
            await asyncio.to_thread(publisher.close)
            if probes is not None:
                await asyncio.to_thread(probes.stop)
            await asyncio.to_thread(readiness.close)
            if service is None:  # ours to close
                await svc.engine.dispose()

    docs = auth.docs_enabled(settings)
    app = FastAPI(
        title="kgstream query API",
        version="0.2.0",
        lifespan=lifespan,
        description="Vector, local, global and path retrieval over the published snapshot; "
        "HTTP ingest of document events. Errors are application/problem+json.",
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.service = svc
    app.state.feedback = FeedbackLedger()  # answers whose verdict this process counted
    app.state.publisher = publisher
    app.state.operations = Operations(svc, publisher, settings)
    app.state.readiness = readiness
    app.state.settings = settings
    problems.install(app)
    auth.install(app, settings, svc.engine)
    for routes in (router, curation_routes.router, review_routes.router, explorer.router):
        app.include_router(routes)
    dashboard.install(app, settings, svc.engine, publisher.bootstrap)
    app.state.mcp = mcp_server.install(app, app.state.operations, settings)
    _guard(app, settings)

    @app.get("/metrics", tags=["operations"])
    async def metrics() -> PlainTextResponse:
        try:
            await refresh_snapshot(svc.engine)
        except Exception as exc:  # noqa: BLE001 - the other figures are still worth serving
            log.info("could not read the published snapshot: %s: %s", type(exc).__name__, exc)
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    return app


def _guard(app: FastAPI, settings: Settings) -> None:
    """Admission control, body limits and HTTP metrics around every route (after
    ``auth.install``: admission authenticates)."""
    # Added last = outermost: the body checks run before anything else reads the request.
    app.add_middleware(
        Admission,
        exempt=EXEMPT_PATHS,
        authenticate=app.state.authenticator.principal,
        max_concurrent=settings.query_max_concurrent,
        per_key=settings.query_max_concurrent_per_key,
        timeout_s=settings.query_timeout_s,
        body_timeout_s=settings.api_body_timeout_s,
        max_waiting_bodies=settings.api_max_waiting_bodies,
    )
    app.add_middleware(BodyLimits, max_bytes=settings.api_max_body_bytes)
    app.add_middleware(HttpMetrics, router=app.router)  # outermost: counts refusals too
