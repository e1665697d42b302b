"""Hostile entity names and questions (quotes, LIKE wildcards, backslashes, SQL fragments, NUL)
are data, never SQL: indexed as written, found by their own names, and every request answers
with a result or a 4xx problem, never a 500 (issue 8, deliverable 9)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, handle_batch
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.support.records import document_event, record, rows

pytestmark = pytest.mark.integration

HOSTILE_TITLE = "O'Brien's \"100%\" _Pure_ Rock \\ Roll'); DROP TABLE documents; --"
HOSTILE = [
    "O'Brien",
    "100%",
    "_Pure_",
    "%",
    "_",
    "\\",
    "\\%",
    "'; DROP TABLE documents; --",
    "Robert'); DELETE FROM entities; --",
    'a " b',
    "C:\\Music\\Hits",
]


@pytest.fixture
async def api(
    deps: IndexerDeps,
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[httpx.AsyncClient]:
    events = [
        document_event(
            event_id="h1",
            doc_id="doc-hostile",
            title=HOSTILE_TITLE,
            text='Sean O\'Brien recorded "100% _Pure_ Rock" with Mary Smith in Dublin. '
            "The tapes were stored in C:\\Music\\Hits by Sean O'Brien.",
        ),
        document_event(event_id="h2", doc_id="doc-curie"),
    ]
    assert await handle_batch(deps, [record(e) for e in events]) == ["applied", "applied"]
    assert settings.database_url is not None
    service = build_query_service(settings, deps.engine, embedder, extractor, cpu_pool)
    app = create_app(
        settings, Endpoints(settings.database_url, str(settings.kafka_bootstrap_servers)), service
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as client:
        yield client


@pytest.mark.parametrize("mode", ["vector", "local", "global", "path", "auto"])
async def test_hostile_questions_are_answered(
    api: httpx.AsyncClient, deps: IndexerDeps, mode: str
) -> None:
    for text in HOSTILE:
        resp = await api.post("/v1/query", json={"question": f"Who is {text}?", "mode": mode})
        assert resp.status_code == 200, (text, resp.text)
    assert (await rows(deps, "SELECT count(*) FROM documents"))[0][0] == 2


async def test_hostile_names_are_found_as_written(api: httpx.AsyncClient) -> None:
    resp = await api.get("/v1/entities", params={"name": "O'Brien's \"100%\" _Pure_ Rock"})
    assert resp.status_code == 200, resp.text
    names = [e["name"] for e in resp.json()["entities"]]
    assert any(n.startswith("O'Brien's \"100%\" _Pure_ Rock") for n in names), names
    for text in HOSTILE:
        resp = await api.get("/v1/entities", params={"name": text})
        assert resp.status_code == 200, (text, resp.text)
        # A bare LIKE wildcard must not match everything.
        if text in ("%", "_", "\\%"):
            assert all("Curie" not in e["name"] for e in resp.json()["entities"]), text
        resp = await api.get("/v1/paths", params={"from": text, "to": "Marie Curie"})
        assert resp.status_code in (200, 404), (text, resp.text)


async def test_nul_is_a_client_error_everywhere(api: httpx.AsyncClient) -> None:
    resp = await api.post("/v1/query", json={"question": "Who is Marie\u0000 Curie?"})
    assert 400 <= resp.status_code < 500, resp.text
    resp = await api.get("/v1/entities", params={"name": "Marie\u0000Curie"})
    assert 400 <= resp.status_code < 500, resp.text
    resp = await api.get("/v1/paths", params={"from": "Marie\u0000", "to": "Paris"})
    assert 400 <= resp.status_code < 500, resp.text
