"""The graph a query process holds (services/retrieval/graph_holder.py) on the 48-document
sample: local mode walking it answers every sample question as local mode walking the database
does (the same passages in the same order, the same hops and answer), for an operator and for a
restricted caller once an ACL change reached it (a query with filters, or waiting for an event,
walks the database); after a delete, a refresh brings it back to what the database answers;
started, it builds in the background and closes."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from services.indexer.deps import IndexerDeps, RawRecord
from services.indexer.handlers import handle_batch
from services.retrieval import service as service_module
from services.retrieval.compose import graph_holder
from services.retrieval.filters import Filters, Range
from services.retrieval.graph_holder import holding
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import build_query_service
from tests.support.access import assign
from tests.support.query_fixtures import SAMPLE, clone_database

pytestmark = pytest.mark.integration

QUESTIONS = [
    json.loads(line)["question"]
    for line in (SAMPLE / "questions.jsonl").read_text(encoding="utf-8").splitlines()
]


def _seen(resp: Any) -> tuple[Any, ...]:
    return (
        resp.mode_used,
        [c.chunk_id for c in resp.contexts],
        [c.why for c in resp.contexts],
        resp.paths,
        resp.answer,
    )


async def _delete(
    url: str,
    settings: Settings,
    doc_id: str,
    models: tuple[OnnxMiniLmEmbedder, SpacyExtractor],
    pool: ThreadPoolExecutor,
) -> None:
    """A delete through the indexer's handler, as the worker applies it."""

    async def nowhere(key: bytes | None, value: bytes) -> None:
        raise AssertionError("no dead letter expected")

    embedder, extractor = models
    engine = make_engine(url)
    deps = IndexerDeps.from_settings(
        settings, engine=engine, embedder=embedder, extractor=extractor, executor=pool,
        publish_dead_letter=nowhere,
    )  # fmt: skip
    event = {"event_id": "holder-delete", "type": "delete", "doc_id": doc_id,
             "occurred_at": "2030-01-01T00:00:00+00:00"}  # fmt: skip
    record = RawRecord("holder", 0, 0, doc_id.encode(), json.dumps(event).encode())
    try:
        assert await handle_batch(deps, [record]) == ["deleted"]
    finally:
        await engine.dispose()


async def test_local_mode_on_the_held_graph_answers_as_on_the_database(
    sample_db: str,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
    walks: list[int],
) -> None:
    url = clone_database(sample_db, sample_db.rsplit("/", 1)[1])
    settings = Settings(database_url=url)
    engine = make_engine(url)
    holder = graph_holder(settings, url)
    try:
        plain = build_query_service(settings, engine, embedder, extractor, cpu_pool)
        held = build_query_service(settings, engine, embedder, extractor, cpu_pool, graph=holder)
        await holder.caught_up()

        async def both(
            req: QueryRequest, caller: Caller
        ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            return (
                _seen(await plain.query(req, caller)),
                _seen(await held.query(req, caller)),
            )

        for question in QUESTIONS:
            req = QueryRequest(question=question, mode="local", k=10, explain=True)
            by_database, by_memory = await both(req, Caller.operator())
            assert by_memory == by_database, question
        assert len(walks) >= len(QUESTIONS) // 2  # questions with no entity fall back to vector

        walked = len(walks)
        async with engine.begin() as conn:  # one document only "hr" may read, logged
            await assign(conn, {_gold_of_first_question(): (None, ["hr"])}, logged=True)
        await holder.caught_up()
        restricted = Caller(groups=frozenset({"sales"}))
        req = QueryRequest(question=QUESTIONS[0], mode="local", k=10, explain=True)
        by_database, by_memory = await both(req, restricted)
        assert by_memory == by_database
        assert len(walks) == walked + 1  # the restricted caller walked the held graph
        scoped = req.model_copy(update={"filters": Filters(occurred_at=Range(gte="1900-01-01"))})
        by_database, by_memory = await both(scoped, restricted)
        assert by_memory == by_database
        assert len(walks) == walked + 1  # a query with filters walked the database
        with pytest.MonkeyPatch.context() as stale:  # a held graph older than the bound
            stale.setattr(service_module, "RESTRICTED_MAX_AGE_S", -1.0)
            by_database, by_memory = await both(req, restricted)
            assert by_memory == by_database
            assert len(walks) == walked + 1  # the restricted caller walked the database
            await both(req, Caller.operator())
            assert len(walks) == walked + 2  # the operator still walks the held graph
        waiting = req.model_copy(update={"after_event": "holder-never"})
        assert held.held_graph(waiting) is None

        # A delete: the held state is behind until it refreshes, then answers as the database.
        before = holder.current()
        assert before is not None
        await _delete(url, settings, _gold_of_first_question(), (embedder, extractor), cpu_pool)
        after = await holder.caught_up()
        assert after.watermark > before.watermark
        for question in QUESTIONS[:10]:
            req = QueryRequest(question=question, mode="local", k=10, explain=True)
            by_database, by_memory = await both(req, Caller.operator())
            assert by_memory == by_database, question
    finally:
        await asyncio.to_thread(holder.close)
        await engine.dispose()


def _gold_of_first_question() -> str:
    first = json.loads((SAMPLE / "questions.jsonl").read_text(encoding="utf-8").splitlines()[0])
    return str(first["gold_doc_ids"][0])


async def test_a_started_holder_builds_in_the_background_and_closes(sample_db: str) -> None:
    settings = Settings(database_url=sample_db, query_graph_refresh_s=0.05)
    holder = graph_holder(settings, sample_db)
    async with holding(holder):
        for _ in range(600):
            if holder.current() is not None:
                break
            await asyncio.sleep(0.05)
        state = holder.current()
        assert state is not None
        assert state.edges.entities.size > 0
        report = holder.report()
        assert report["held"] is True
        assert report["watermark"] == state.watermark
        assert report["error"] == ""
    assert holder.current() is state  # closed: nothing refreshes it any more
