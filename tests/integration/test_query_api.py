"""The query API against the real database: every mode, the graph endpoints, and every error
path as application/problem+json."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.infra.ports import free_port
from services.core.settings import Settings
from services.query_api.app import create_app
from services.retrieval.community_vectors import CommunityVectors
from services.retrieval.global_mode import rank_communities
from services.retrieval.service import build_query_service
from tests.conftest import Infra

pytestmark = pytest.mark.integration
LELAND = "hotpotqa-aebaeed5d73f"
OVERDRIVE = "hotpotqa-d50de2bed6aa"
PROBLEM = "application/problem+json"


async def _client(
    url: str, infra: Infra, embedder: OnnxMiniLmEmbedder, extractor: SpacyExtractor, pool: Any
) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap)
    service = build_query_service(settings, make_engine(url), embedder, extractor, pool)
    app = create_app(settings, Endpoints(url, infra.bootstrap), service=service)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client
    await service.engine.dispose()


@pytest.fixture(scope="module")
async def api(
    community_db: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(community_db, infra, embedder, extractor, cpu_pool):
        yield client


@pytest.fixture(scope="module")
async def bare_api(
    sample_db: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(sample_db, infra, embedder, extractor, cpu_pool):
        yield client


async def ask(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    resp = await client.post("/v1/query", json=body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


LELAND_Q = "Who directed the film that was shot in or around Leland, North Carolina in 1986"


@pytest.mark.parametrize("mode", ["vector", "local"])
async def test_vector_and_local_find_both_documents(api: httpx.AsyncClient, mode: str) -> None:
    data = await ask(api, question=LELAND_Q, mode=mode, k=5)
    assert data["mode_used"] == mode
    assert data["snapshot_id"] is not None
    docs = [c["doc_id"] for c in data["contexts"]]
    assert {LELAND, OVERDRIVE} <= set(docs)
    assert all({"doc_id", "chunk_id", "text", "score", "why"} <= set(c) for c in data["contexts"])
    assert data["answer"].endswith("]")  # extractive: a quoted sentence and its source
    assert data["timings"]["total_ms"] > 0
    if mode == "local":
        assert "Leland" in " ".join(data["grounded_entities"])
        assert all(len(hop) == 4 for hop in data["paths"])
        assert "graph (ppr)" in data["contexts"][0]["why"]


async def test_global_ranks_communities_by_breadth(api: httpx.AsyncClient) -> None:
    data = await ask(api, question="What are the main themes about airports?", mode="global")
    assert data["mode_used"] == "global"
    assert data["communities"][0]["title"] == "Airports in the United States"
    assert data["communities"][0]["level"] == 0
    assert "Airport" in data["contexts"][0]["title"]
    assert data["answer"].startswith(
        "The documents are mainly about: 1) Airports in the United States [community "
    )
    assert "\nAirports in the United States: " in data["answer"]  # its summary supports it
    leaf = await ask(api, question="Which airport is county-owned?", mode="global", k=3)
    assert {c["level"] for c in leaf["communities"]} == {0, 1}  # leaves: 2 (level 0) and 3
    assert leaf["communities"][0]["id"] == 3
    level1 = await ask(api, question="airports", mode="global", level=1)
    assert [c["id"] for c in level1["communities"]] == [3]


async def test_in_memory_community_ranking_matches_sql(
    community_db: str, embedder: OnnxMiniLmEmbedder
) -> None:
    engine = make_engine(community_db)
    vectors = CommunityVectors()
    operator = Caller.operator()
    try:
        async with engine.connect() as conn:
            snapshot = int(await conn.scalar(text("SELECT max(id) FROM snapshots")))
            for question in ("Which airport is county-owned?", "main themes", "Leland"):
                embedding = embedder.embed([question])[0]
                for level in (None, 0, 1):
                    rank = functools.partial(
                        rank_communities,
                        conn,
                        snapshot_id=snapshot,
                        level=level,
                        question=question,
                        embedding=embedding,
                        n=8,
                        caller=operator,
                    )
                    by_sql, in_memory = await rank(), await rank(vectors=vectors)
                    assert [h.id for h in in_memory] == [h.id for h in by_sql], (question, level)
                    for a, b in zip(in_memory, by_sql, strict=True):
                        assert a.score == pytest.approx(b.score, abs=1e-5)
                        assert (a.title, a.level, a.size) == (b.title, b.level, b.size)
            # an older snapshot's matrices are dropped when a newer one is read
            await vectors.level(conn, snapshot + 1, None)
            assert vectors._vectors.snapshot == snapshot + 1
            assert set(vectors._vectors.values) == {None}
    finally:
        await engine.dispose()


async def test_path_mode_explains_the_connection(api: httpx.AsyncClient) -> None:
    data = await ask(api, question="How is Leland connected to Maximum Overdrive?", mode="path")
    assert data["mode_used"] == "path"
    route = data["routes"][0]
    assert route["entities"][0] == "Leland" or route["entities"][-1] == "Leland"
    assert all(hop[3] for hop in route["hops"])  # every hop has an evidence sentence
    assert data["contexts"][0]["doc_id"] in {LELAND, OVERDRIVE}
    assert len(data["contexts"]) == 5  # topped up with the best passages


@pytest.mark.parametrize(
    ("question", "mode_used"),
    [
        ("What are the main themes across the collection?", "global"),
        (LELAND_Q, "local"),
        ("How is Leland connected to Maximum Overdrive?", "path"),
        ("tell me about a song and a luau", "vector"),
    ],
)
async def test_auto_routes(api: httpx.AsyncClient, question: str, mode_used: str) -> None:
    data = await ask(api, question=question, mode="auto")
    assert data["mode_used"] == mode_used
    assert data["notes"][0].startswith(f"auto → {mode_used}")
    assert data["contexts"]


async def test_graph_modes_fall_back_to_vector(
    api: httpx.AsyncClient, bare_api: httpx.AsyncClient
) -> None:
    local = await ask(api, question="which song was written after a luau", mode="local")
    assert local["mode_used"] == "vector"
    assert local["contexts"][0]["doc_id"] == "hotpotqa-cf441d60ebea"
    assert "no entity" in local["notes"][-1]
    glob = await ask(bare_api, question="main themes?", mode="global")
    assert glob["mode_used"] == "vector"
    assert glob["snapshot_id"] is None
    assert glob["contexts"]
    path = await ask(api, question="How is Leland connected?", mode="path")
    assert path["mode_used"] in ("local", "vector")
    assert path["contexts"]


async def test_explain_false_hides_paths(api: httpx.AsyncClient) -> None:
    data = await ask(api, question=LELAND_Q, mode="local", explain=False)
    assert data["paths"] == []
    assert data["grounded_entities"] == []
    assert all(c["why"] == "" for c in data["contexts"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "question"),
        ({"question": ""}, "question"),
        ({"question": "x" * 2001}, "question"),
        ({"question": "q", "k": 0}, "k"),
        ({"question": "q", "k": 51}, "k"),
        ({"question": "q", "mode": "bogus"}, "mode"),
        ({"question": "q", "level": -1}, "level"),
        ({"question": "q", "colour": "red"}, "colour"),
        ([1, 2], "body"),
    ],
)
async def test_query_validation_problems(api: httpx.AsyncClient, body: Any, field: str) -> None:
    resp = await api.post("/v1/query", json=body)
    assert resp.status_code == 422
    assert resp.headers["content-type"] == PROBLEM
    problem = resp.json()
    assert problem["status"] == 422
    assert problem["title"] == "Invalid request"
    assert problem["instance"] == "/v1/query"
    assert any(e["field"].startswith(field) for e in problem["errors"]), problem


async def test_malformed_json_is_a_problem(api: httpx.AsyncClient) -> None:
    resp = await api.post(
        "/v1/query", content=b'{"question": ', headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422
    assert resp.headers["content-type"] == PROBLEM
    assert "JSON" in resp.json()["detail"]


async def test_entities_search_and_detail(api: httpx.AsyncClient) -> None:
    found = (await api.get("/v1/entities", params={"name": "leland"})).json()
    leland = found["entities"][0]
    assert leland["name"] == "Leland"
    assert leland["score"] == 1.0
    fuzzy = (await api.get("/v1/entities", params={"name": "Maximum Overdriv"})).json()
    assert fuzzy["entities"][0]["name"] == "Maximum Overdrive"
    # exact: the name or an alias itself, no similar names
    only = (await api.get("/v1/entities", params={"name": "leland", "exact": True})).json()
    assert [e["name"] for e in only["entities"]] == ["Leland"]
    none = await api.get("/v1/entities", params={"name": "Maximum Overdriv", "exact": True})
    assert none.json()["entities"] == []
    detail = (await api.get(f"/v1/entities/{leland['id']}")).json()
    assert detail["neighbours"]
    assert all(n["evidence"] for n in detail["neighbours"])
    missing = await api.get("/v1/entities/999999")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == PROBLEM
    assert "999999" in missing.json()["detail"]
    assert (await api.get("/v1/entities")).status_code == 422
    assert (await api.get("/v1/entities/abc")).status_code == 422


async def test_paths_endpoint(api: httpx.AsyncClient) -> None:
    params: dict[str, str | int] = {"from": "Leland", "to": "Maximum Overdrive", "k": 2}
    data = (await api.get("/v1/paths", params=params)).json()
    assert data["source"]["name"] == "Leland"
    assert 1 <= len(data["paths"]) <= 2
    assert all(len(p["hops"]) <= 6 for p in data["paths"])
    by_id = await api.get(
        "/v1/paths", params={"from": str(data["source"]["id"]), "to": "Maximum Overdrive"}
    )
    assert by_id.json()["source"]["id"] == data["source"]["id"]
    too_far = await api.get("/v1/paths", params={**params, "max_hops": 7})
    assert too_far.status_code == 422
    assert too_far.json()["errors"][0]["field"] == "max_hops"
    unknown = await api.get("/v1/paths", params={"from": "Qzxwv Plmokn", "to": "Leland"})
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == PROBLEM
    assert "from=" in unknown.json()["detail"]


async def test_communities_endpoint(api: httpx.AsyncClient, bare_api: httpx.AsyncClient) -> None:
    level0 = (await api.get("/v1/communities", params={"level": 0})).json()
    assert {c["id"] for c in level0["communities"]} == {1, 2}
    everything = (await api.get("/v1/communities")).json()
    assert len(everything["communities"]) == 3
    assert everything["communities"][2]["parent_id"] == 1
    # an entity's communities (the explorer shows them): Watertown's airport is in 1 and 3
    airport = await api.get("/v1/entities", params={"name": "Watertown International Airport"})
    entity = airport.json()["entities"][0]["id"]
    its = (await api.get("/v1/communities", params={"entity": entity})).json()["communities"]
    assert sorted(c["id"] for c in its) == [1, 3]
    at_level = (await api.get("/v1/communities", params={"entity": entity, "level": 0})).json()
    assert [c["id"] for c in at_level["communities"]] == [1]
    none = (await bare_api.get("/v1/communities")).json()
    assert none == {"snapshot_id": None, "level": None, "communities": []}
    assert (await api.get("/v1/communities", params={"level": 99})).status_code == 422


async def test_operations_endpoints(api: httpx.AsyncClient) -> None:
    assert (await api.get("/healthz")).json() == {"status": "ok"}
    ready = (await api.get("/readyz")).json()
    assert ready["status"] == "ready"
    assert ready["database"].startswith("postgresql+psycopg://")
    assert ready["snapshot"] == (await api.get("/v1/communities")).json()["snapshot_id"]
    spec = (await api.get("/openapi.json")).json()
    assert {"/v1/query", "/v1/entities", "/v1/paths", "/v1/documents"} <= set(spec["paths"])
    assert (await api.get("/v1/status")).json()["documents"] == 48
    assert "kgstream_query_seconds" in (await api.get("/metrics")).text
    unknown = await api.get("/v1/nothing")
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == PROBLEM


async def test_database_down_is_503(
    infra: Infra, embedder: OnnxMiniLmEmbedder, extractor: SpacyExtractor, cpu_pool: Any
) -> None:
    nowhere = f"postgresql+psycopg://kgstream:x@127.0.0.1:{free_port()}/kgstream"
    async for client in _client(nowhere, infra, embedder, extractor, cpu_pool):
        resp = await client.post("/v1/query", json={"question": "anything", "mode": "vector"})
        assert resp.status_code == 503
        assert resp.headers["content-type"] == PROBLEM
        assert resp.json()["title"] == "Database unavailable"
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["status"] == "unavailable"


async def test_each_request_decides_whole_corpus_once(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-corpus check runs once per read (QueryService.read_as), however many look-ups
    the request makes in it: /v1/paths resolves two names and loads routes in one read."""
    from services.retrieval import service as service_module
    from services.retrieval.visibility import widened as real

    calls: list[Caller] = []

    async def counted(conn: Any, caller: Caller) -> Caller:
        calls.append(caller)
        return await real(conn, caller)

    monkeypatch.setattr(service_module, "widened", counted)
    resp = await api.get("/v1/paths", params={"from": "Leland", "to": "Maximum Overdrive"})
    assert resp.status_code == 200, resp.text
    assert len(calls) == 1
    await ask(api, question=LELAND_Q, mode="path", k=3)
    assert len(calls) == 2
