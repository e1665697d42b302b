"""Issue 18 ("Smaller"): with the broker gone after the API had published, HTTP ingest answered
503 only after 10 s, while KGSTREAM_INGEST_PUBLISH_TIMEOUT_S (5 s) is documented as the whole
wait: the producer's flush and then each acknowledgement waited the full timeout in turn."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.support.faults import own_broker

pytestmark = pytest.mark.integration
EVENT = {"event_id": "e", "type": "upsert", "doc_id": "d", "text": "t",
         "occurred_at": "2026-01-01T00:00:00Z"}  # fmt: skip
# The documented wait is 5 s; 8 s leaves room for a loaded machine and stays below the 10 s
# the two waits in a row took.
BOUND_S = 8.0


async def test_broker_gone_answers_503_within_the_publish_timeout(
    settings: Settings,
    tmp_path: Path,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    """Failed on 4163b39: 503 after 10.0 s."""
    assert settings.database_url is not None
    assert settings.ingest_publish_timeout_s == 5.0
    with own_broker(tmp_path / "broker", settings) as broker:
        api_settings = settings.model_copy(update={"kafka_bootstrap_servers": broker.bootstrap})
        engine = make_engine(settings.database_url)
        service = build_query_service(api_settings, engine, embedder, extractor, cpu_pool)
        app = create_app(
            api_settings, Endpoints(settings.database_url, broker.bootstrap), service=service
        )
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api"
            ) as client:
                first = await client.post("/v1/documents", json=EVENT)
                assert first.status_code == 202, first.text
                broker.stop()
                for attempt in range(2):
                    t0 = time.monotonic()
                    resp = await client.post("/v1/documents", json={**EVENT, "event_id": "e2"})
                    took = time.monotonic() - t0
                    assert resp.status_code == 503, resp.text
                    assert took < BOUND_S, (attempt, took)
        finally:
            await asyncio.to_thread(app.state.publisher.close)
            await engine.dispose()
