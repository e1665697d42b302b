"""Query API process: the composition root for FastAPI. Routes translate HTTP to
QueryService calls; HTTP status codes live only here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, generate_latest
from sqlalchemy import text

from services.core.db.engine import check_schema, make_engine
from services.core.errors import ConfigurationError
from services.core.infra.manager import Endpoints
from services.core.models import build_embedder, build_extractor
from services.core.settings import Settings
from services.core.status import database_status
from services.query_api.schemas import QueryRequest, QueryResponse
from services.query_api.service import QueryService

LATENCY = Histogram(
    "kgstream_query_seconds",
    "Query latency by mode",
    ["mode"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
)


def get_service(request: Request) -> QueryService:
    """The process's QueryService (set up by create_app)."""
    service: QueryService = request.app.state.service
    return service


ServiceDep = Annotated[QueryService, Depends(get_service)]


def build_service(settings: Settings, endpoints: Endpoints) -> QueryService:
    """The query service with its engine and models (used by the API and the CLI)."""
    return QueryService(
        engine=make_engine(endpoints.database_url),
        embedder=build_embedder(settings),
        extractor=build_extractor(settings),
        executor=ThreadPoolExecutor(max_workers=2, thread_name_prefix="kgstream-query"),
    )


def create_app(settings: Settings, endpoints: Endpoints) -> FastAPI:
    """The FastAPI app; models load once at start-up."""
    service = build_service(settings, endpoints)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await check_schema(service.engine, settings.embedding_dim)
        yield
        await service.engine.dispose()

    app = FastAPI(title="kgstream query API", version="0.1.0", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(ConfigurationError)
    async def _config_error(_: Request, exc: ConfigurationError) -> JSONResponse:
        return JSONResponse(
            {
                "type": "about:blank",
                "title": "Service misconfigured",
                "status": 503,
                "detail": str(exc),
            },
            status_code=503,
            media_type="application/problem+json",
        )

    @app.post("/v1/query", response_model=QueryResponse)
    async def query(req: QueryRequest, svc: ServiceDep) -> QueryResponse:
        with LATENCY.labels(mode=req.mode).time():
            return await svc.query(req)

    @app.get("/v1/status")
    async def status(svc: ServiceDep) -> dict[str, Any]:
        return await database_status(svc.engine)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(svc: ServiceDep) -> JSONResponse:
        try:
            async with svc.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:  # noqa: BLE001 - readiness reports any failure
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    return app
