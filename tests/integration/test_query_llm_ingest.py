"""LLM answers (synthesis, routing, global map-reduce) against the OpenAI-compatible stub, and
HTTP ingest against the real broker."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from kafka import KafkaConsumer, TopicPartition

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.infra.topics import ensure_topics
from services.core.llm.client import process_client
from services.core.settings import Settings
from services.query_api.app import create_app
from services.retrieval import answer, followup, router
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import QueryService, build_query_service
from tests.conftest import Infra
from tests.support.openai_stub import OpenAIStub, document_blocks

pytestmark = pytest.mark.integration


def fake_llm(body: dict[str, Any]) -> str:
    system = body["messages"][0]["content"]
    if system == router.ROUTER_SYSTEM:
        return json.dumps({"mode": "local", "reason": "names a place"})
    if system == answer.MAP_SYSTEM:
        return json.dumps({"points": [{"text": "Airports serve their regions", "score": 70}]})
    if system == answer.REDUCE_SYSTEM:
        return "Airports serve their regions [1]."
    if system == followup.FOLLOWUP_SYSTEM:  # one follow-up search, then enough
        if "Already searched for:" in body["messages"][1]["content"]:
            return json.dumps({"answerable": True})
        return json.dumps({"answerable": False, "query": FOLLOW_UP_QUERY})
    return "Stephen King directed Maximum Overdrive [1]."


FOLLOW_UP_QUERY = "Sandra Oh Grey's Anatomy"
SANDRA_OH = "hotpotqa-7832ff20f664"
LELAND = "hotpotqa-aebaeed5d73f"


@pytest.fixture
async def llm_service(
    community_db: str,
    openai_stub: OpenAIStub,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[QueryService]:
    openai_stub.chat_handler = fake_llm
    settings = Settings(database_url=community_db, openai_base_url=openai_stub.base_url)
    service = build_query_service(
        settings,
        make_engine(community_db),
        embedder,
        extractor,
        cpu_pool,
        client=process_client(settings),
    )
    yield service
    await service.engine.dispose()


async def test_llm_routes_and_answers_with_citations(
    llm_service: QueryService, openai_stub: OpenAIStub
) -> None:
    question = "Who directed the film shot in Leland, North Carolina?"
    resp = await llm_service.query(
        QueryRequest(question=question, mode="auto", k=3), Caller.operator()
    )
    assert resp.mode_used == "local"
    assert resp.notes[0] == "auto → local: LLM: names a place"
    assert resp.answer == "Stephen King directed Maximum Overdrive [1]."
    assert resp.support == f"[1] {resp.contexts[0].doc_id}"  # the sources it cites
    assert resp.tokens["calls"] == 2
    assert resp.tokens["prompt"] > 0
    chat = openai_stub.requests_to("/chat/completions")
    prompt = chat[-1].body["messages"][1]["content"]
    assert prompt.startswith('Sources:\n\n<document id="1">\n')
    assert resp.contexts[0].doc_id in prompt
    assert question in prompt


async def test_local_follow_up_searches_merge_by_reciprocal_rank(
    community_db: str,
    openai_stub: OpenAIStub,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    openai_stub.chat_handler = fake_llm
    settings = Settings(
        database_url=community_db, openai_base_url=openai_stub.base_url, query_local_followups=2
    )
    client = process_client(settings)
    service = build_query_service(
        settings, make_engine(community_db), embedder, extractor, cpu_pool, client=client
    )
    question = "Who directed the film shot in Leland, North Carolina?"
    try:
        resp = await service.query(
            QueryRequest(question=question, mode="local", k=2), Caller.operator()
        )
        # the first retrieval's best passage, then the follow-up's (ties keep the first ranking)
        assert [c.doc_id for c in resp.contexts] == [LELAND, SANDRA_OH]
        assert resp.contexts[0].score == resp.contexts[1].score == round(1 / 61, 6)
        assert f"follow-up searches: {FOLLOW_UP_QUERY}" in resp.notes
        # two follow-up decisions (the second says the passages suffice), then the answer
        assert resp.tokens["calls"] == 3
        assert (resp.tokens["followup_calls"], resp.tokens["answer_calls"]) == (2, 1)
        spent = resp.tokens["prompt"] + resp.tokens["completion"]
        assert 0 < resp.tokens["followup_tokens"] < spent  # the follow-ups' cost, reported
        chat = [r.body for r in openai_stub.requests_to("/chat/completions")]
        asks = [b for b in chat if b["messages"][0]["content"] == followup.FOLLOWUP_SYSTEM]
        assert len(asks) == 2
        assert asks[0]["response_format"] == {"type": "json_object"}
        searched = document_blocks(asks[1]["messages"][1]["content"])[-1]
        assert searched == ("searched", FOLLOW_UP_QUERY)
        assert "Sandra Oh" in chat[-1]["messages"][1]["content"]  # the answer reads the merge

        # a failing LLM keeps the first retrieval and still answers
        openai_stub.fail_next("400")
        kept = await service.query(
            QueryRequest(question=question, mode="local", k=2), Caller.operator()
        )
        assert "LLM follow-up failed (BadRequestError)" in kept.notes
        assert SANDRA_OH not in [c.doc_id for c in kept.contexts]
        assert kept.answer == "Stephen King directed Maximum Overdrive [1]."
    finally:
        await service.engine.dispose()


async def test_llm_router_failure_falls_back_to_heuristics(
    llm_service: QueryService, openai_stub: OpenAIStub
) -> None:
    openai_stub.fail_next("400")
    resp = await llm_service.query(
        QueryRequest(question="main themes?", mode="auto"), Caller.operator()
    )
    assert resp.mode_used == "global"
    assert resp.notes[0].startswith("auto → global: asks about themes")


async def test_global_map_reduce(llm_service: QueryService, openai_stub: OpenAIStub) -> None:
    resp = await llm_service.query(
        QueryRequest(question="What do airports do?", mode="global"), Caller.operator()
    )
    assert resp.mode_used == "global"
    assert resp.answer == "Airports serve their regions [1]."
    chat = openai_stub.requests_to("/chat/completions")
    maps = [r for r in chat if r.body["messages"][0]["content"] == answer.MAP_SYSTEM]
    assert len(maps) == len(resp.communities) == 2  # the leaves: communities 2 and 3
    reduce_prompt = chat[-1].body["messages"][1]["content"]
    assert "Airports serve their regions [" in reduce_prompt
    assert resp.tokens["calls"] == 3


@pytest.fixture
async def ingest_api(
    sample_db: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    topic = f"docs-{uuid.uuid4().hex[:8]}"
    ensure_topics(infra.bootstrap, {topic: 2})
    settings = Settings(
        database_url=sample_db, kafka_bootstrap_servers=infra.bootstrap, documents_topic=topic
    )
    service = build_query_service(settings, make_engine(sample_db), embedder, extractor, cpu_pool)
    app = create_app(settings, Endpoints(sample_db, infra.bootstrap), service=service)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as client:
        yield client, topic
    app.state.publisher.close()
    await service.engine.dispose()


def event(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": f"http-{n}",
        "type": "upsert",
        "doc_id": f"doc-{n}",
        "title": f"Doc {n}",
        "text": "Some text.",
        "occurred_at": "2026-01-01T00:00:00Z",
        **extra,
    }


def consume(bootstrap: str, topic: str, expected: int, timeout: float = 20) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    messages: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(messages) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            messages.extend(batch)
    for batch in consumer.poll(timeout_ms=500).values():  # nothing more than expected
        messages.extend(batch)
    consumer.close()
    return messages


async def test_http_ingest_publishes_valid_events_only(
    ingest_api: tuple[httpx.AsyncClient, str], infra: Infra
) -> None:
    client, topic = ingest_api
    one = await client.post("/v1/documents", json=event(1))
    assert one.status_code == 202
    assert one.json() == {"accepted": 1, "event_ids": ["http-1"], "topic": topic}
    two = await client.post("/v1/documents", json=[event(2), event(3)])
    assert two.json()["event_ids"] == ["http-2", "http-3"]
    bad = await client.post("/v1/documents", json=[event(4), event(5, type="rename"), {"x": 1}])
    assert bad.status_code == 422
    assert bad.headers["content-type"] == "application/problem+json"
    problem = bad.json()
    assert problem["detail"] == "2 invalid event(s); nothing was published"
    assert [e["index"] for e in problem["errors"]] == [1, 2]
    assert problem["errors"][0]["event_id"] == "http-5"
    assert "'rename' is not one of" in problem["errors"][0]["errors"][0]
    empty = await client.post("/v1/documents", json=[])
    assert empty.status_code == 422
    deleted = await client.delete("/v1/documents/doc-1")
    assert deleted.status_code == 202
    delete_id = deleted.json()["event_ids"][0]

    messages = consume(infra.bootstrap, topic, expected=4)
    values = {json.loads(m.value)["event_id"]: json.loads(m.value) for m in messages}
    assert set(values) == {"http-1", "http-2", "http-3", delete_id}
    assert values[delete_id]["type"] == "delete"
    assert {m.key for m in messages} == {b"doc-1", b"doc-2", b"doc-3"}


async def test_llm_failure_leaves_an_extractive_answer(
    llm_service: QueryService, openai_stub: OpenAIStub
) -> None:
    openai_stub.fail_next("400")
    resp = await llm_service.query(
        QueryRequest(question="Where is Leland?", mode="vector"), Caller.operator()
    )
    assert resp.answer.endswith("]")
    assert resp.notes[-1] == "LLM answer failed (BadRequestError); extractive answer"
    assert resp.contexts
