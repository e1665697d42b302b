"""A question that names a source reads that source's documents (services/retrieval/facets.py),
on the real database: the vocabulary read by SQL (facet fields only), the grounded filter in
every mode with its note, visibility unchanged for a restricted caller, the read without it
when the named documents answer nothing, and nothing grounded when the caller wrote filters."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.llm.client import process_client
from services.core.settings import Settings
from services.retrieval import router
from services.retrieval.facets import FacetCache
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import QueryService, build_query_service
from tests.conftest import Infra
from tests.support.openai_stub import OpenAIStub
from tests.support.query_fixtures import clone_database

pytestmark = pytest.mark.integration
SOURCES = ("The Daily Planet", "Gotham Gazette | City News", "Metropolis Weekly")


@pytest.fixture
async def sourced(community_db: str) -> tuple[str, dict[str, str]]:
    """A copy of the sample database whose documents have sources (every other one
    restricted): its URL and each document's source."""
    url = clone_database(community_db, community_db.rsplit("/", 1)[1])
    engine = make_engine(url)
    async with engine.begin() as conn:
        docs = [str(r[0]) for r in await conn.execute(text("SELECT doc_id FROM documents"))]
        source = {d: SOURCES[i % len(SOURCES)] for i, d in enumerate(sorted(docs))}
        await conn.execute(
            text(
                "UPDATE documents SET metadata = metadata || CAST(:m AS jsonb), acl = :a"
                " WHERE doc_id = :d"
            ),
            [
                {
                    "d": d,
                    "m": json.dumps({"source": s, "url": f"https://example.org/{d}"}),
                    "a": ["red"] if i % 2 else None,  # every other document restricted
                }
                for i, (d, s) in enumerate(sorted(source.items()))
            ],
        )
    await engine.dispose()
    return url, source


@pytest.fixture
async def service(
    sourced: tuple[str, dict[str, str]],
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[tuple[QueryService, dict[str, str]]]:
    url, source = sourced
    engine = make_engine(url)
    settings = Settings(home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap)
    yield build_query_service(settings, engine, embedder, extractor, cpu_pool), source
    await engine.dispose()


async def test_the_vocabulary_holds_facets_only(
    service: tuple[QueryService, dict[str, str]],
) -> None:
    svc, _ = service
    async with svc.engine.connect() as conn:
        vocabulary = await FacetCache().get(conn)
    named = vocabulary.visible_to(Caller())
    assert set(named) == {"source"}  # url: one value per document, not a facet
    assert named["source"]["Gotham Gazette"] == {"Gotham Gazette | City News"}


@pytest.mark.parametrize("mode", ["vector", "local", "global", "auto"])
async def test_a_named_source_is_read_alone(
    service: tuple[QueryService, dict[str, str]], mode: str
) -> None:
    svc, source = service
    question = "What does the Gotham Gazette say about the airport of the region?"
    # (A restricted caller reads no community here: half the documents are hidden from it.)
    for caller in (Caller.operator(), *([Caller()] if mode != "global" else [])):
        resp = await svc.query(QueryRequest(question=question, mode=mode, k=8), caller)
        assert resp.contexts, resp.notes
        assert "grounded filters: source named 'Gotham Gazette'" in resp.notes
        assert {source[c.doc_id] for c in resp.contexts} == {"Gotham Gazette | City News"}


async def test_nothing_answers_in_the_named_source_then_read_as_asked(
    service: tuple[QueryService, dict[str, str]],
) -> None:
    svc, source = service
    async with svc.engine.begin() as conn:  # The Daily Planet's documents: all restricted
        await conn.execute(
            text(
                "UPDATE documents SET acl = '{red}' WHERE metadata->>'source' = 'The Daily Planet'"
            )
        )
    question = "What does The Daily Planet say about Leland?"
    resp = await svc.query(QueryRequest(question=question, mode="vector", k=5), Caller())
    assert resp.contexts
    assert not any(n.startswith("grounded") for n in resp.notes), resp.notes
    assert "The Daily Planet" not in {source[c.doc_id] for c in resp.contexts}


@pytest.mark.parametrize("mode", ["vector", "local", "auto"])
async def test_a_source_no_document_is_from_is_not_answered(
    service: tuple[QueryService, dict[str, str]], mode: str
) -> None:
    """A question that attributes its facts to a source the collection does not hold says it
    does not know (the passages are still returned); one that names a held source answers."""
    svc, _ = service
    operator = Caller.operator()  # the rule is for callers who read every document
    unheld = "What did a Bloomberg report and an article by Reuters say about Leland?"
    resp = await svc.query(QueryRequest(question=unheld, mode=mode, k=5), operator)
    assert resp.abstained
    assert resp.answer.startswith("I don't know: no document here is from Bloomberg, Reuters")
    assert "not held: no document is from Bloomberg, Reuters" in resp.notes
    held = "What did a Gotham Gazette report say about Leland?"
    answered = await svc.query(QueryRequest(question=held, mode=mode, k=5), operator)
    assert not answered.abstained, answered.answer
    # A name the documents mention may be what the question means: not judged missing.
    talked_of = "What did a Stephen King article say about Leland?"
    mentioned = await svc.query(QueryRequest(question=talked_of, mode=mode, k=5), operator)
    assert not mentioned.abstained, mentioned.answer
    # A caller who may not read every document is not told: whether it is would show which
    # sources its unreadable documents are from.
    restricted = await svc.query(QueryRequest(question=unheld, mode=mode, k=5), Caller())
    assert not restricted.abstained, restricted.answer
    assert not any(n.startswith("not held") for n in restricted.notes)


async def test_the_callers_filters_win(service: tuple[QueryService, dict[str, str]]) -> None:
    svc, source = service
    req = QueryRequest.model_validate(
        {
            "question": "What does the Gotham Gazette say?",
            "mode": "vector",
            "filters": {"metadata": {"source": "Metropolis Weekly"}},
        }
    )
    resp = await svc.query(req, Caller.operator())
    assert resp.notes[0].startswith("filters: ")
    assert {source[c.doc_id] for c in resp.contexts} == {"Metropolis Weekly"}


async def test_the_vocabulary_is_read_again_in_the_background(
    service: tuple[QueryService, dict[str, str]],
) -> None:
    svc, _ = service
    cache = FacetCache(ttl_s=0)
    async with svc.engine.connect() as conn:
        first = await cache.get(conn)  # the first read: in the caller's transaction
        assert "Metropolis" not in first.visible_to(Caller())["source"]
        await conn.commit()
        async with svc.engine.begin() as write:
            await write.execute(
                text(
                    "UPDATE documents SET metadata = jsonb_set(metadata, '{source}',"
                    " '\"Metropolis\"') WHERE metadata->>'source' = 'Metropolis Weekly'"
                )
            )
        stale = await cache.get(conn)  # answered at once with what it has
        assert stale is first
        refresh = cache._refresh
        assert refresh is not None
        await refresh  # read on a connection of its own
        fresh = await cache.get(conn)
        if cache._refresh is not None:  # ttl 0: the next read has started already
            await cache._refresh
    assert "Metropolis" in fresh.visible_to(Caller())["source"]


CLASSIFIED = {  # question -> the sources the stub classifier reads in it
    "What does the gazette of Gotham report about the airport?": ["the gotham gazette"],
    "What did the wire service say about Leland?": ["Bloomberg"],
    "What did a Reuters report say about Leland?": [],
}


async def test_the_llm_classifier_names_the_sources(  # noqa: PLR0917 - fixtures
    sourced: tuple[str, dict[str, str]],
    openai_stub: OpenAIStub,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    """With an LLM, auto mode's classifier names the question's sources: a name that is a form
    of a value (case and "The" aside) grounds the read, one no document is from is answered
    "I don't know" without an answer call, and none named leaves it to the rule."""
    url, source = sourced

    def chat(body: dict[str, object]) -> str:
        messages = body["messages"]
        assert isinstance(messages, list)
        if messages[0]["content"] == router.ROUTER_SYSTEM:
            named = CLASSIFIED[messages[1]["content"]]
            return json.dumps({"mode": "vector", "reason": "one fact", "sources": named})
        return "An answer [1]."

    openai_stub.chat_handler = chat
    settings = Settings(
        home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap,
        openai_base_url=openai_stub.base_url,
    )  # fmt: skip
    engine = make_engine(url)
    llm = build_query_service(
        settings, engine, embedder, extractor, cpu_pool, client=process_client(settings)
    )
    gotham, wire, reuters = list(CLASSIFIED)
    operator = Caller.operator()
    grounded = await llm.query(QueryRequest(question=gotham, mode="auto", k=5), operator)
    assert "grounded filters: source named 'the gotham gazette'" in grounded.notes
    assert {source[c.doc_id] for c in grounded.contexts} == {"Gotham Gazette | City News"}
    assert not grounded.abstained
    calls = len(openai_stub.requests_to("/chat/completions"))
    unheld = await llm.query(QueryRequest(question=wire, mode="auto", k=5), operator)
    assert unheld.abstained
    assert unheld.answer == "I don't know: no document here is from Bloomberg."
    assert len(openai_stub.requests_to("/chat/completions")) == calls + 1  # the router only
    by_rule = await llm.query(QueryRequest(question=reuters, mode="auto", k=5), operator)
    assert by_rule.abstained
    assert "Reuters" in by_rule.answer
    await engine.dispose()
