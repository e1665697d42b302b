"""The query API in process, behind an httpx client, on a test database (keys required)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Executor
from contextlib import asynccontextmanager

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.embedding import Embedder
from services.core.extraction import Extractor
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.conftest import Infra


@asynccontextmanager
async def api_client(
    infra: Infra,
    url: str,
    engine: AsyncEngine,
    models: tuple[Embedder, Extractor, Executor],
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the API on the database at ``url`` (``engine``), with ``models`` (embedder,
    extractor and their CPU pool); ``headers`` go with every request."""
    settings = Settings(
        home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap,
        auth="required",
    )  # fmt: skip
    service = build_query_service(settings, engine, *models)
    app = create_app(settings, Endpoints(url, infra.bootstrap), service=service)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api", headers=headers
        ) as client:
            yield client
    finally:
        await asyncio.to_thread(app.state.publisher.close)  # the ingest endpoint's producer
