"""Document ACLs and tenants, end to end through the HTTP API on the real database.

The 48-document sample (with the hand-made community snapshot) is indexed once through the
indexer's handlers; between examples only ``documents.tenant`` and ``documents.acl`` change,
which is legitimate because visibility is read live at query time. An oracle built from the raw
provenance rows and ``Caller.can_see`` (the reference rule) says what each caller may see; every
chunk, entity, name, alias, relationship, evidence sentence, path hop and community returned
must be traceable to a visible document."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.access import Caller
from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.llm.client import process_client
from services.core.settings import Settings
from services.query_api.app import create_app
from services.query_api.auth import get_caller
from services.retrieval import service as service_module
from services.retrieval import vector, visibility
from services.retrieval.compose import graph_holder
from services.retrieval.filters import Filters
from services.retrieval.llm import OpenAIChat
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import QueryService, build_query_service
from services.retrieval.visibility import widened
from tests.conftest import Infra
from tests.support.access import accesses, assign
from tests.support.mcp_client import LOCAL, mcp_client, payload, sessions_running
from tests.support.openai_stub import OpenAIStub
from tests.support.plan_oracle import plan_answer, plans, read_rows
from tests.support.query_fixtures import COMMUNITIES, SAMPLE, clone_database

pytestmark = pytest.mark.integration
GROUPS = ("g1", "g2", "g3")
TENANTS = (None, "t1", "t2")
EXAMPLES = int(os.environ.get("KGSTREAM_ACL_EXAMPLES", "30"))
# The properties that run fewer examples (each one costs more: MCP sessions, filters).
HALF = settings(
    max_examples=max(EXAMPLES // 2, 5),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MODES = ("vector", "local", "global", "path", "auto")
Access = tuple[str | None, list[str] | None]
OPEN: Access = (None, None)
QUESTIONS = [
    json.loads(line)["question"]
    for line in (SAMPLE / "questions.jsonl").read_text(encoding="utf-8").splitlines()[:10]
] + [
    "How is Leland connected to Maximum Overdrive?",
    "What are the main themes across the collection?",
    "Which airports serve their regions?",
    "Who directed the film that was shot in or around Leland, North Carolina in 1986",
]


@dataclass
class Corpus:
    """Provenance rows, read once: content never changes in this module, only access."""

    docs: list[str]
    chunk_doc: dict[int, str]
    chunk_text: dict[int, str]
    mentions: list[tuple[int, str, str, str]]  # entity, doc, surface, sentence
    evidence: list[tuple[int, int, int, str, str, str]]  # rel, source, target, type, doc, sentence
    community_docs: dict[int, set[str]]
    names: list[str]  # stored entity names, for questions and look-ups
    entity_ids: list[int]


@dataclass
class Oracle:
    """What ``caller`` may see under ``access``, from Caller.can_see over the raw rows; with
    ``admitted`` (the documents a query's filters admit, by DocScope.admits), what a filtered
    query may read: passages, entities and relationships of visible documents in scope, while
    communities and the answer (which may quote a community's summary) answer to visibility
    alone (docs/retrieval.md, "Filters")."""

    corpus: Corpus
    caller: Caller
    access: dict[str, Access]
    admitted: set[str] | None = None
    docs: set[str] = field(init=False)
    surfaces: dict[int, set[str]] = field(init=False)
    mention_counts: dict[int, int] = field(init=False)
    entity_sentences: dict[int, set[str]] = field(init=False)
    rel_sentences: dict[tuple[int, int, str], set[str]] = field(init=False)
    communities: set[int] = field(init=False)
    hidden_sentences: set[str] = field(init=False)

    def __post_init__(self) -> None:
        c = self.corpus
        visible = {d for d in c.docs if self.caller.can_see(*self.access[d])}
        self.docs = visible if self.admitted is None else visible & self.admitted
        self.surfaces, self.mention_counts, self.entity_sentences = {}, {}, {}
        for entity, doc, surface, sentence in c.mentions:
            if doc in self.docs:
                self.surfaces.setdefault(entity, set()).add(surface)
                self.mention_counts[entity] = self.mention_counts.get(entity, 0) + 1
                self.entity_sentences.setdefault(entity, set()).add(sentence)
        self.rel_sentences = {}
        for _, source, target, rtype, doc, sentence in c.evidence:
            if doc in self.docs and source in self.surfaces and target in self.surfaces:
                for key in ((source, target, rtype), (target, source, rtype)):
                    self.rel_sentences.setdefault(key, set()).add(sentence)
        self.communities = {
            cid for cid, docs in c.community_docs.items() if docs and docs <= visible
        }
        visible_text = "\n".join(t for k, t in c.chunk_text.items() if c.chunk_doc[k] in visible)
        hidden = {s for _, d, _, s in c.mentions if d not in visible}
        hidden |= {s for *_, d, s in c.evidence if d not in visible}
        self.hidden_sentences = {s for s in hidden if len(s) >= 20 and s not in visible_text}

    @property
    def all_surfaces(self) -> set[str]:
        return set().union(*self.surfaces.values()) if self.surfaces else set()

    def no_hidden_text(self, value: str) -> None:
        leaked = [s for s in self.hidden_sentences if s in value]
        assert not leaked, f"text from invisible documents: {leaked[:2]}"

    def traceable(self, value: str, sentences: Iterable[str]) -> None:
        """Empty, or built from visible sentences (it starts with one, maybe cut short), and
        containing no sentence found only in invisible documents."""
        self.no_hidden_text(value)
        if value:
            assert any(s.startswith(value) or value.startswith(s) for s in sentences), value

    def check_query(self, data: dict[str, Any]) -> None:
        c = self.corpus
        for ctx in data["contexts"]:
            assert ctx["doc_id"] in self.docs, ctx["doc_id"]
            assert c.chunk_doc[ctx["chunk_id"]] == ctx["doc_id"]
            assert ctx["text"] == c.chunk_text[ctx["chunk_id"]]
        every_rel = set().union(*self.rel_sentences.values()) if self.rel_sentences else set()
        hops = list(data["paths"]) + [h for r in data["routes"] for h in r["hops"]]
        for a, _, b, sentence in hops:
            assert {a, b} <= self.all_surfaces, (a, b)
            self.traceable(sentence, every_rel)
        for route in data["routes"]:
            assert set(route["entities"]) <= self.all_surfaces
        assert set(data["grounded_entities"]) <= self.all_surfaces
        assert {h["id"] for h in data["communities"]} <= self.communities
        self.no_hidden_text(data["answer"])

    def check_summary(self, entity: dict[str, Any]) -> None:
        eid = entity["id"]
        assert eid in self.surfaces, f"invisible entity {eid}"
        assert entity["name"] in self.surfaces[eid]
        assert set(entity["aliases"]) <= self.surfaces[eid]
        assert entity["mentions"] == self.mention_counts[eid]


class CallerBox:
    """The caller the test app runs requests as (overrides the auth dependency)."""

    caller: Caller = Caller.operator()


@dataclass
class Env:
    client: httpx.AsyncClient
    service: QueryService
    corpus: Corpus
    box: CallerBox
    keyed: httpx.AsyncClient  # the same database behind KGSTREAM_AUTH=required
    keyed_app: FastAPI

    @property
    def engine(self) -> AsyncEngine:
        return self.service.engine

    async def assign(self, access: dict[str, Access]) -> None:
        """Set documents' tenants and ACLs, logging their chunks' access changes as the indexer
        does, and bring the held graph up to them."""
        async with self.engine.begin() as conn:
            await assign(conn, access, logged=True)
        assert self.service.graph is not None
        await self.service.graph.caught_up()

    async def describe(self, described: dict[str, tuple[dict[str, Any], datetime]]) -> None:
        """Set each document's metadata and occurred_at (what filters read, live)."""
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE documents SET metadata = CAST(:m AS jsonb), occurred_at = :t"
                    " WHERE doc_id = :d"
                ),
                [{"d": d, "m": json.dumps(m), "t": t} for d, (m, t) in described.items()],
            )

    async def get(self, caller: Caller, path: str, **params: Any) -> httpx.Response:
        self.box.caller = caller
        return await self.client.get(path, params=params)

    async def ask(self, caller: Caller, **body: Any) -> dict[str, Any]:
        self.box.caller = caller
        resp = await self.client.post("/v1/query", json=body)
        assert resp.status_code == 200, resp.text
        data: dict[str, Any] = resp.json()
        return data


async def _corpus(engine: AsyncEngine) -> Corpus:
    async with engine.connect() as conn:

        async def rows(sql: str) -> list[Any]:
            return list((await conn.execute(text(sql))).all())

        chunks = await rows("SELECT id, doc_id, text FROM chunks")
        mentions = await rows("SELECT entity_id, doc_id, surface, sentence FROM mentions")
        evidence = await rows(
            "SELECT ev.relationship_id, r.source_id, r.target_id, r.type, ev.doc_id, ev.sentence"
            " FROM relationship_evidence ev JOIN relationships r ON r.id = ev.relationship_id"
        )
        members = await rows(
            "SELECT cm.community_id, cm.entity_id FROM community_members cm JOIN snapshots s"
            " ON s.id = cm.snapshot_id WHERE s.status = 'published'"
        )
        entities = await rows("SELECT id, name FROM entities ORDER BY id")
        docs = await rows("SELECT doc_id FROM documents ORDER BY doc_id")
    member_of: dict[int, set[int]] = {}
    for cid, eid in members:
        member_of.setdefault(int(cid), set()).add(int(eid))
    community_docs = {
        cid: {d for e, d, _, _ in mentions if e in ids}
        | {d for _, s, t, _, d, _ in evidence if s in ids and t in ids}
        for cid, ids in member_of.items()
    }
    return Corpus(
        docs=[str(r[0]) for r in docs],
        chunk_doc={int(r[0]): str(r[1]) for r in chunks},
        chunk_text={int(r[0]): str(r[2]) for r in chunks},
        mentions=[(int(e), str(d), str(s), str(x)) for e, d, s, x in mentions],
        evidence=[
            (int(r), int(s), int(t), str(y), str(d), str(x)) for r, s, t, y, d, x in evidence
        ],
        community_docs=community_docs,
        names=[str(r[1]) for r in entities],
        entity_ids=[int(r[0]) for r in entities],
    )


def _app(url: str, infra: Infra, service: QueryService, **settings: Any) -> FastAPI:
    config = Settings(
        home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap, **settings
    )
    return create_app(config, Endpoints(url, infra.bootstrap), service=service)


@pytest.fixture(scope="module")
async def env(
    community_db: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[Env]:
    url = clone_database(community_db, community_db.rsplit("/", 1)[1])
    settings = Settings(home=infra.home, database_url=url, kafka_bootstrap_servers=infra.bootstrap)
    holder = graph_holder(settings, url)  # local mode walks the held graph, as the API does
    service = build_query_service(
        settings, make_engine(url), embedder, extractor, cpu_pool, graph=holder
    )
    await holder.caught_up()
    app = _app(url, infra, service)
    box = CallerBox()
    app.dependency_overrides[get_caller] = lambda: box.caller
    keyed = _app(url, infra, service, auth="required")  # callers from real API keys
    transport, keyed_transport = httpx.ASGITransport(app=app), httpx.ASGITransport(app=keyed)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://api") as client,
        httpx.AsyncClient(transport=keyed_transport, base_url="http://api") as keyed_client,
        sessions_running(keyed.state.mcp),
    ):
        corpus = await _corpus(service.engine)
        yield Env(client, service, corpus, box, keyed_client, keyed)
    await asyncio.to_thread(holder.close)
    await service.engine.dispose()


def _questions(data: st.DataObject, names: st.SearchStrategy[str]) -> list[tuple[str, str]]:
    """One or two (mode, question) pairs: a path question between two drawn entity names, or
    a question of the sample."""
    asked = []
    for mode in data.draw(st.lists(st.sampled_from(MODES), min_size=1, max_size=2), "modes"):
        if mode == "path":
            a, b = data.draw(names, "from"), data.draw(names, "to")
            asked.append((mode, f"What is the connection between {a} and {b}?"))
        else:
            asked.append((mode, data.draw(st.sampled_from(QUESTIONS), "question")))
    return asked


ACCESS = accesses(TENANTS, GROUPS)


@st.composite
def scenarios(draw: st.DrawFn, docs: list[str]) -> tuple[dict[str, Access], Caller]:
    """Most documents open to one base tenant, a random subset restricted at random; a caller
    usually of the base tenant (so that something is visible), with random groups."""
    base = draw(st.sampled_from(TENANTS))
    restricted = draw(st.sets(st.sampled_from(docs), max_size=len(docs)))
    access = {d: (draw(ACCESS) if d in restricted else (base, None)) for d in docs}
    tenant = draw(st.sampled_from([base, base, *TENANTS]))
    groups = draw(st.frozensets(st.sampled_from(GROUPS)))
    return access, Caller(tenant=tenant, groups=groups)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_no_leak_across_modes_and_endpoints(env: Env, data: st.DataObject) -> None:
    corpus = env.corpus
    access, caller = data.draw(scenarios(corpus.docs), label="scenario")
    await env.assign(access)
    oracle = Oracle(corpus, caller, access)
    names = st.sampled_from(corpus.names)
    share = len(oracle.docs) / len(corpus.docs)
    event("visible documents: " + ("none" if not share else "all" if share == 1 else "some"))
    event(f"readable communities: {len(oracle.communities)}")

    for mode, question in _questions(data, names):
        oracle.check_query(await env.ask(caller, question=question, mode=mode, k=8))

    found = (await env.get(caller, "/v1/entities", name=data.draw(names, "name"))).json()
    for entity in found["entities"]:
        oracle.check_summary(entity)

    entity_id = data.draw(st.sampled_from(corpus.entity_ids), "entity")
    resp = await env.get(caller, f"/v1/entities/{entity_id}", neighbours=50)
    assert resp.status_code == (200 if entity_id in oracle.surfaces else 404)
    if resp.status_code == 200:
        detail = resp.json()
        oracle.check_summary(detail)
        oracle.traceable(detail["description"], oracle.entity_sentences[entity_id])
        for n in detail["neighbours"]:
            assert n["name"] in oracle.surfaces[n["id"]]
            sentences = oracle.rel_sentences[(entity_id, n["id"], n["relation"])]
            assert n["evidence"] in sentences

    await _check_explorer_reads(env, caller, oracle, data)

    a, b = data.draw(names, "path from"), data.draw(names, "path to")
    resp = await env.get(caller, "/v1/paths", **{"from": a, "to": b, "k": 3})
    assert resp.status_code in (200, 404)
    if resp.status_code == 200:
        body = resp.json()
        oracle.check_summary(body["source"])
        oracle.check_summary(body["target"])
        oracle.check_query({**_empty_query(), "routes": body["paths"]})

    await _check_facts(env, caller, oracle)
    listed = (await env.get(caller, "/v1/communities")).json()["communities"]
    assert {c["id"] for c in listed} <= oracle.communities
    member = data.draw(st.sampled_from(corpus.entity_ids), "member")
    listed = (await env.get(caller, "/v1/communities", entity=member)).json()["communities"]
    assert {c["id"] for c in listed} <= oracle.communities

    doc_id = data.draw(st.sampled_from(corpus.docs), "document")
    resp = await env.get(caller, f"/v1/documents/{doc_id}")
    assert resp.status_code == (200 if doc_id in oracle.docs else 404)
    if resp.status_code == 200:
        oracle.no_hidden_text(resp.json()["text"])

    # The other local ranker (the seeds' path formula) walks a second relationship ring.
    paths_ranker = replace(env.service, config=replace(env.service.config, local_ranker="paths"))
    question = data.draw(st.sampled_from(QUESTIONS), "paths-ranker question")
    resp_local = await paths_ranker.query(QueryRequest(question=question, mode="local"), caller)
    oracle.check_query(resp_local.model_dump())


async def _check_explorer_reads(
    env: Env, caller: Caller, oracle: Oracle, data: st.DataObject
) -> None:
    """The explorer's routes (/explorer): a drawn entity's neighbourhood, its mentions, and
    the evidence of its relationships, and of a drawn relationship, are what the caller sees."""
    corpus = env.corpus
    entity_id = data.draw(st.sampled_from(corpus.entity_ids), "explored")
    hops = data.draw(st.sampled_from([1, 2]), "hops")
    resp = await env.get(caller, f"/v1/entities/{entity_id}/neighbourhood", hops=hops)
    assert resp.status_code == (200 if entity_id in oracle.surfaces else 404)
    edges = []
    if resp.status_code == 200:
        hood = resp.json()
        related = {(s, t) for s, t, _ in oracle.rel_sentences}
        around = {t for s, t in related if s == entity_id and t != entity_id}
        assert hood["neighbours"] == len(around)  # hidden neighbours are not even counted
        first = {n["id"] for n in hood["nodes"] if n["hops"] == 1}
        assert first <= around
        for node in hood["nodes"]:
            assert node["name"] in oracle.surfaces[node["id"]]
            assert node["mentions"] == oracle.mention_counts[node["id"]]
            if node["hops"] == 2:  # reached through a relationship the caller sees
                assert any((f, node["id"]) in related for f in first)
        for edge in hood["edges"]:
            assert (edge["source"], edge["target"], edge["type"]) in oracle.rel_sentences
            edges.append(edge["id"])
        touched = {e["source"] for e in hood["edges"]} | {e["target"] for e in hood["edges"]}
        assert {n["id"] for n in hood["nodes"] if n["hops"]} <= touched  # none drawn alone
    mentions = (await env.get(caller, f"/v1/entities/{entity_id}/mentions")).json()["mentions"]
    for m in mentions:
        assert m["doc_id"] in oracle.docs
        assert m["sentence"] in oracle.entity_sentences[entity_id]
    visible = {r for r, s, t, y, *_ in corpus.evidence if (s, t, y) in oracle.rel_sentences}
    drawn = data.draw(st.sampled_from(sorted({r for r, *_ in corpus.evidence})), "relationship")
    for rel in {*edges[:3], drawn}:
        resp = await env.get(caller, f"/v1/relationships/{rel}")
        assert resp.status_code == (200 if rel in visible else 404)
        if resp.status_code == 200:
            detail = resp.json()
            key = (detail["source"]["id"], detail["target"]["id"], detail["type"])
            for said in detail["evidence"]:
                assert said["doc_id"] in oracle.docs
                assert said["sentence"] in oracle.rel_sentences[key]


@HALF
@given(data=st.data())
async def test_no_leak_through_mcp(env: Env, data: st.DataObject) -> None:
    """The same oracle over the MCP tools, as a real API key of the drawn caller, through
    /mcp of the KGSTREAM_AUTH=required app (the SDK's client)."""
    corpus = env.corpus
    access, caller = data.draw(scenarios(corpus.docs), label="scenario")
    await env.assign(access)
    oracle = Oracle(corpus, caller, access)
    names = st.sampled_from(corpus.names)
    _, key = await create_key(env.engine, ["query"], tenant=caller.tenant, groups=caller.groups)
    async with mcp_client(f"{LOCAL}/mcp", key, app=env.keyed_app) as client:
        mode = data.draw(st.sampled_from(MODES), "mode")
        question = data.draw(st.sampled_from(QUESTIONS), "question")
        tool = data.draw(st.sampled_from(["search", "answer"]), "tool")
        found = payload(await client.call_tool(tool, {"question": question, "mode": mode}))
        oracle.check_query({**_empty_query(), **found})

        # With filters: the scoped oracle (the documents' descriptions drawn here).
        filters, admitted = await _describe_and_filter(env, data)
        arguments = {"question": question, "mode": mode, "filters": filters}
        found = payload(await client.call_tool(tool, arguments))
        Oracle(corpus, caller, access, admitted).check_query({**_empty_query(), **found})

        entity_id = data.draw(st.sampled_from(corpus.entity_ids), "entity")
        got = await client.call_tool("get_entity", {"entity": str(entity_id), "neighbours": 50})
        if got.is_error:
            assert entity_id not in oracle.surfaces
        else:
            detail = payload(got)
            oracle.check_summary(detail)
            for n in detail["neighbours"]:
                assert n["name"] in oracle.surfaces[n["id"]]

        a, b = data.draw(names, "path from"), data.draw(names, "path to")
        routes = await client.call_tool("find_paths", {"source": a, "target": b})
        if not routes.is_error:
            body = payload(routes)
            oracle.check_summary(body["source"])
            oracle.check_summary(body["target"])
            oracle.check_query({**_empty_query(), "routes": body["paths"]})

        listed = payload(await client.call_tool("list_communities", {"limit": 1000}))
        assert {c["id"] for c in listed["communities"]} <= oracle.communities

        doc_id = data.draw(st.sampled_from(corpus.docs), "document")
        document = await client.call_tool("get_document", {"doc_id": doc_id})
        assert document.is_error == (doc_id not in oracle.docs)
        if not document.is_error:
            oracle.no_hidden_text(payload(document)["text"])


SOURCES = ("The Verge", "Wired", "TechCrunch")
DAY0 = datetime(2023, 11, 20, tzinfo=UTC)
DESCRIPTIONS = st.tuples(
    st.fixed_dictionaries(
        {"source": st.sampled_from(SOURCES), "rank": st.integers(0, 9)},
        optional={"tags": st.lists(st.sampled_from(GROUPS), max_size=2, unique=True)},
    ),
    st.integers(0, 6 * 24).map(lambda h: DAY0 + timedelta(hours=h)),
)
FILTERS = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "source": st.one_of(
                    st.sampled_from(SOURCES), st.lists(st.sampled_from(SOURCES), min_size=1)
                ),
                "rank": st.sampled_from([{"gte": 3}, {"lt": 5}, {"gt": 2, "lte": 7}, 4]),
                "tags": st.sampled_from(GROUPS),
            },
        ),
        "occurred_at": st.sampled_from(
            [{"gte": "2023-11-22"}, {"lte": "2023-11-23"}, {"gt": "2023-11-21T12:00:00Z"}]
        ),
    },
)


async def _describe_and_filter(env: Env, data: st.DataObject) -> tuple[dict[str, Any], set[str]]:
    """Draw every document's metadata and occurred_at, and a query's filters: (the filters,
    the documents they admit by DocScope.admits)."""
    docs = env.corpus.docs
    described = {d: data.draw(DESCRIPTIONS, f"doc {i}") for i, d in enumerate(docs)}
    await env.describe(described)
    filters = data.draw(FILTERS, label="filters")
    scope = Filters.model_validate(filters).scope()
    admitted = {d for d, (m, t) in described.items() if scope is None or scope.admits(m, t)}
    return filters, admitted


@HALF
@given(data=st.data())
async def test_filters_narrow_and_never_widen(env: Env, data: st.DataObject) -> None:
    """A query's filters, in every mode, for restricted callers and the operator: every
    passage, entity, path and grounding comes from a visible document the filters admit
    (DocScope.admits, the rule kgstream_doc_matches states in SQL); communities and answers
    stay within what the caller may see."""
    corpus = env.corpus
    access, caller = data.draw(scenarios(corpus.docs), label="scenario")
    caller = data.draw(st.sampled_from([caller, Caller.operator()]), label="caller")
    await env.assign(access)
    filters, admitted = await _describe_and_filter(env, data)
    scope = Filters.model_validate(filters).scope()
    oracle = Oracle(corpus, caller, access, admitted)
    share = len(oracle.docs) / len(corpus.docs)
    event("documents read: " + ("none" if not share else "all" if share == 1 else "some"))
    names = st.sampled_from(corpus.names)
    for mode, question in _questions(data, names):
        got = await env.ask(caller, question=question, mode=mode, k=8, filters=filters)
        oracle.check_query(got)
        if scope is not None:
            assert got["notes"][0].startswith("filters: "), got["notes"]

    # The graph routes take the same filters (a JSON query parameter).
    scoped = {"filters": json.dumps(filters)}
    found = (await env.get(caller, "/v1/entities", name=data.draw(names, "name"), **scoped)).json()
    for entity in found["entities"]:
        oracle.check_summary(entity)
    entity_id = data.draw(st.sampled_from(corpus.entity_ids), "entity")
    resp = await env.get(caller, f"/v1/entities/{entity_id}", neighbours=50, **scoped)
    assert resp.status_code == (200 if entity_id in oracle.surfaces else 404)
    if resp.status_code == 200:
        detail = resp.json()
        oracle.check_summary(detail)
        for n in detail["neighbours"]:
            assert n["evidence"] in oracle.rel_sentences[(entity_id, n["id"], n["relation"])]
    a, b = data.draw(names, "path from"), data.draw(names, "path to")
    resp = await env.get(caller, "/v1/paths", **{"from": a, "to": b, "k": 3}, **scoped)
    assert resp.status_code in (200, 404)
    if resp.status_code == 200:
        oracle.check_query({**_empty_query(), "routes": resp.json()["paths"]})
    await _check_facts(env, caller, oracle, **scoped)


async def _check_facts(env: Env, caller: Caller, oracle: Oracle, **params: str) -> None:
    """Every time-scoped fact read (the sample states years) comes from a document the oracle
    reads, and names entities by surfaces the caller may see."""
    resp = await env.get(caller, "/v1/facts", **{"from": "1000-01-01", "limit": 200}, **params)
    assert resp.status_code == 200, resp.text
    for fact in resp.json()["facts"]:
        assert fact["doc_id"] in oracle.docs
        for entity in fact["entities"]:
            assert entity["name"] in oracle.surfaces[entity["id"]]
        for rel in fact["relationships"]:
            assert rel["source"] in oracle.surfaces[rel["source_id"]]
            assert rel["target"] in oracle.surfaces[rel["target_id"]]


async def test_filters_are_validated(env: Env) -> None:
    env.box.caller = Caller.operator()
    for bad, says in [
        ({"metadata": {"rank": {}}}, "at least one of gte"),
        ({"metadata": {"rank": {"gte": 1, "lt": "2023-01-01"}}}, "all numbers or all times"),
        ({"metadata": {"published": {"gte": "Nov 24 2023"}}}, "not an ISO 8601"),
        ({"metadata": {"a..b": 1}}, "a..b"),
        ({"occurred_at": {"gte": 3}}, "not numbers"),
        ({"colour": "red"}, "colour"),
    ]:
        resp = await env.client.post("/v1/query", json={"question": "q", "filters": bad})
        assert resp.status_code == 422, (bad, resp.text)
        assert says in resp.text, (bad, resp.text)
        resp = await env.client.get(
            "/v1/entities", params={"name": "x", "filters": json.dumps(bad)}
        )
        assert resp.status_code == 422, (bad, resp.text)
        assert resp.json()["title"] == "Invalid filters", resp.text
    resp = await env.client.get("/v1/entities", params={"name": "x", "filters": "{not json"})
    assert resp.status_code == 422, resp.text


def _empty_query() -> dict[str, Any]:
    return {
        "contexts": [],
        "paths": [],
        "routes": [],
        "grounded_entities": [],
        "communities": [],
        "answer": "",
    }


async def test_tenants_are_isolated(env: Env) -> None:
    docs = env.corpus.docs
    half = set(docs[: len(docs) // 2])
    access: dict[str, Access] = {d: ("t1" if d in half else "t2", None) for d in docs}
    await env.assign(access)
    t1, t2 = Caller(tenant="t1"), Caller(tenant="t2")
    oracle = Oracle(env.corpus, t1, access)
    for mode in MODES:
        for question in QUESTIONS[-4:]:
            one = await env.ask(t1, question=question, mode=mode, k=10)
            two = await env.ask(t2, question=question, mode=mode, k=10)
            assert {c["doc_id"] for c in one["contexts"]} <= half
            assert not {c["doc_id"] for c in two["contexts"]} & half
            oracle.check_query(one)
    vector = await env.ask(t1, question=QUESTIONS[-1], mode="vector", k=10)
    assert vector["contexts"], "the caller's own tenant is searched"
    # No tenant sees only untenanted documents: here, none.
    nobody = Caller()
    assert not (await env.ask(nobody, question=QUESTIONS[-1], mode="vector"))["contexts"]
    assert not (await env.get(nobody, "/v1/entities", name="Leland")).json()["entities"]
    assert not (await env.get(nobody, "/v1/communities")).json()["communities"]
    admin = await env.ask(Caller.operator(), question=QUESTIONS[-1], mode="vector", k=10)
    assert {c["doc_id"] for c in admin["contexts"]} - half, "an admin sees every tenant"


def _comparable(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "mode": data["mode_used"],
        "chunks": [c["chunk_id"] for c in data["contexts"]],
        "paths": data["paths"],
        "routes": [(r["entities"], r["hops"]) for r in data["routes"]],
        "communities": [c["id"] for c in data["communities"]],
        "grounded": data["grounded_entities"],
    }


async def test_admin_sees_everything_as_before(env: Env) -> None:
    docs = env.corpus.docs
    await env.assign(dict.fromkeys(docs, OPEN))
    admin, everyone = Caller.operator(), Caller()
    cases = [(q, m) for m in MODES for q in QUESTIONS[-4:]]
    before = [_comparable(await env.ask(admin, question=q, mode=m)) for q, m in cases]
    # A restricted caller who can see every document gets the operator's answers: the facts
    # rebuilt from visible mentions and evidence equal the stored ones.
    assert before == [_comparable(await env.ask(everyone, question=q, mode=m)) for q, m in cases]
    leland = (await env.get(admin, "/v1/entities", name="Leland")).json()["entities"][0]
    detail = (await env.get(admin, f"/v1/entities/{leland['id']}")).json()
    assert (await env.get(everyone, f"/v1/entities/{leland['id']}")).json() == detail
    listed = (await env.get(admin, "/v1/communities")).json()
    assert (await env.get(everyone, "/v1/communities")).json() == listed

    locked: dict[str, Access] = {d: ("t9", []) for d in docs}  # visible to admins only
    await env.assign(locked)
    assert before == [_comparable(await env.ask(admin, question=q, mode=m)) for q, m in cases]
    assert (await env.get(admin, f"/v1/entities/{leland['id']}")).json() == detail
    assert (await env.get(admin, "/v1/communities")).json() == listed
    assert (await env.get(everyone, f"/v1/entities/{leland['id']}")).status_code == 404
    assert not (await env.ask(everyone, question=QUESTIONS[-1], mode="local"))["contexts"]


async def test_hostile_tenant_and_group_names_are_bound_values(env: Env) -> None:
    docs = env.corpus.docs
    odd_tenant, odd_group = "o'brien\\%_\"; --", "g'1%_\\"
    leland = "hotpotqa-aebaeed5d73f"
    access: dict[str, Access] = dict.fromkeys(docs, ("t1", None))
    access[leland] = (odd_tenant, [odd_group])
    await env.assign(access)
    question = "Who directed the film that was shot in or around Leland, North Carolina in 1986"
    insider = Caller(tenant=odd_tenant, groups=frozenset({odd_group}))
    seen = await env.ask(insider, question=question, mode="local", k=10)
    assert {c["doc_id"] for c in seen["contexts"]} == {leland}
    for outsider in (
        Caller(tenant=odd_tenant, groups=frozenset({"g%"})),
        Caller(tenant="o'brien%", groups=frozenset({odd_group})),
        Caller(tenant="t1", groups=frozenset({odd_group, "' OR true --"})),
    ):
        data = await env.ask(outsider, question=question, mode="local", k=10)
        assert leland not in {c["doc_id"] for c in data["contexts"]}


async def test_api_keys_carry_tenant_and_groups(env: Env) -> None:
    docs = env.corpus.docs
    leland, overdrive = "hotpotqa-aebaeed5d73f", "hotpotqa-d50de2bed6aa"
    access: dict[str, Access] = dict.fromkeys(docs, ("t2", None))
    access |= {leland: ("t1", ["g1"]), overdrive: ("t1", ["g2"])}
    await env.assign(access)
    _, reader = await create_key(env.engine, ["query"], tenant="t1", groups=["g1"])
    _, admin = await create_key(env.engine, ["admin"], tenant="t1")
    question = {"question": QUESTIONS[-1], "mode": "local", "k": 10}

    async def docs_seen(key: str) -> set[str]:
        headers = {"Authorization": f"Bearer {key}"}
        resp = await env.keyed.post("/v1/query", json=question, headers=headers)
        assert resp.status_code == 200, resp.text
        return {c["doc_id"] for c in resp.json()["contexts"]}

    assert await docs_seen(reader) == {leland}
    assert {leland, overdrive} <= await docs_seen(admin)
    only_overdrive = next(
        e
        for e in env.corpus.entity_ids
        if {d for x, d, _, _ in env.corpus.mentions if x == e} == {overdrive}
    )
    path = f"/v1/entities/{only_overdrive}"
    headers = {"Authorization": f"Bearer {reader}"}
    assert (await env.keyed.get(path, headers=headers)).status_code == 404
    headers = {"Authorization": f"Bearer {admin}"}
    assert (await env.keyed.get(path, headers=headers)).status_code == 200


async def test_restricted_vector_search_without_iterative_scan(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgvector < 0.8 has no hnsw.iterative_scan and rejects it: the query still answers."""
    await env.assign(dict.fromkeys(env.corpus.docs, OPEN))
    monkeypatch.setattr(vector, "ITERATIVE_SCAN", "SET LOCAL hnsw.no_such_setting = on")
    req = QueryRequest(question=QUESTIONS[-1], mode="vector", k=5)
    resp = await env.service.query(req, Caller())
    assert len(resp.contexts) == 5


async def test_global_map_reduce_sends_the_llm_only_visible_communities(
    env: Env, openai_stub: OpenAIStub
) -> None:
    """The LLM path of global mode (map over community summaries, then reduce) sees only
    communities the caller may read: the filter runs before ranking, so before the map step."""
    songs = next(cid for cid, _, _, title, *_ in COMMUNITIES if title.startswith("Songs"))
    airports = next(cid for cid, _, _, title, *_ in COMMUNITIES if title.startswith("Airports"))
    hidden_docs = env.corpus.community_docs[songs]
    access: dict[str, Access] = {
        d: ((None, ["g1"]) if d in hidden_docs else OPEN) for d in env.corpus.docs
    }
    caller = Caller(tenant=None, groups=frozenset())
    oracle = Oracle(env.corpus, caller, access)
    assert songs not in oracle.communities
    assert airports in oracle.communities
    summary = {cid: text for cid, _, _, _, text, _ in COMMUNITIES}
    client = process_client(Settings(openai_base_url=openai_stub.base_url, llm_max_attempts=1))
    assert client is not None
    service = replace(env.service, llm=OpenAIChat(client, "stub-chat", 1))
    await env.assign(access)
    try:
        for question in ("What are the main themes across the collection?", "Songs and music?"):
            req = QueryRequest(question=question, mode="global", k=10)
            oracle.check_query((await service.query(req, caller)).model_dump(mode="json"))
    finally:
        await env.assign(dict.fromkeys(env.corpus.docs, OPEN))
    sent = [
        "\n".join(str(m.get("content", "")) for m in r.body.get("messages", []))
        for r in openai_stub.requests_to("/chat/completions")
    ]
    assert any(summary[airports] in body for body in sent), "the map step never ran"
    for body in sent:
        assert summary[songs] not in body
        oracle.no_hidden_text(body)


@HALF
@given(data=st.data())
async def test_a_restricted_walk_in_memory_equals_the_database(
    env: Env, walks: list[int], data: st.DataObject
) -> None:
    """Local mode walks the held graph for a restricted caller (issue 32, step 4) and answers
    what walking the database answers it: contexts, paths, routes, grounding and answer."""
    access, caller = data.draw(scenarios(env.corpus.docs), label="scenario")
    await env.assign(access)
    for question in data.draw(st.lists(st.sampled_from(QUESTIONS), min_size=1, max_size=2)):
        walks.clear()
        held = _answers(await env.ask(caller, question=question, mode="local"))
        assert walks or not held["grounded"], "the local query did not walk the held graph"
        with pytest.MonkeyPatch.context() as patched:  # no held graph: walk the database
            patched.setattr(QueryService, "held_graph", lambda _self, _req: None)
            walked = _answers(await env.ask(caller, question=question, mode="local"))
        assert held == walked


def _filtered_reads_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read takes the filtered statements, as before the whole-corpus check."""

    async def as_given(_conn: object, caller: Caller) -> Caller:
        return caller

    monkeypatch.setattr(service_module, "widened", as_given)  # the one place reads widen


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_whole_corpus_check_follows_the_rule(env: Env, data: st.DataObject) -> None:
    """A caller reads without filters exactly when ``Caller.can_see`` holds for every live
    document (deleted ones do not count), whatever the tenants and ACLs."""
    docs = env.corpus.docs
    access, caller = data.draw(scenarios(docs), label="scenario")
    gone = data.draw(st.sets(st.sampled_from(docs), max_size=3), label="deleted")
    await env.assign(access)
    async with env.engine.begin() as conn:
        await conn.execute(
            text("UPDATE documents SET deleted = doc_id = ANY(:g)"), {"g": sorted(gone)}
        )
        decided = await widened(conn, caller)
        await conn.rollback()
    expected = all(caller.can_see(*access[d]) for d in docs if d not in gone)
    event(f"whole corpus: {expected}")
    assert decided.whole_corpus is expected
    assert decided.admin is False
    no_conn = cast(AsyncConnection, _NoConn())
    assert (await widened(no_conn, Caller.operator())).whole_corpus is False  # no question


class _NoConn:
    """A connection that must not be used."""

    async def scalar(self, *_: object) -> None:
        raise AssertionError("an admin needs no whole-corpus check")


async def test_whole_corpus_check_gives_up_past_its_probes(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = env.corpus.docs
    probes = 8  # the sample's 48 documents, one ACL each, are more than the check's probes
    monkeypatch.setattr(visibility, "WHOLE_CORPUS_ACL_PROBES", probes)
    access: dict[str, Access] = {d: (None, [f"g{i:03}"]) for i, d in enumerate(docs)}
    await env.assign(access)
    try:
        every_group = Caller(groups=frozenset(a[0] for _, a in access.values() if a))
        some_groups = Caller(groups=frozenset(f"g{i:03}" for i in range(probes - 1)))
        async with env.engine.connect() as conn:
            # Sees every document, but through more distinct ACLs than the check walks: the
            # filtered reads, which are right, only slower.
            assert not (await widened(conn, every_group)).whole_corpus
            assert not (await widened(conn, some_groups)).whole_corpus
        async with env.engine.begin() as conn:
            await conn.execute(
                text("UPDATE documents SET acl = CAST(:a AS text[]) WHERE acl[1] >= :cut"),
                {"a": ["g000"], "cut": f"g{probes - 1:03}"},
            )
            assert (await widened(conn, every_group)).whole_corpus
            await conn.rollback()
    finally:
        await env.assign(dict.fromkeys(docs, OPEN))


def _answers(data: dict[str, Any]) -> dict[str, Any]:
    return {**_comparable(data), "answer": data["answer"]}


@pytest.mark.parametrize("case", ["open", "groups", "deleted"])
async def test_whole_corpus_reads_equal_the_filtered_reads(
    env: Env, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A caller who sees every live document gets, through the unfiltered statements, what the
    filtered statements give it: every mode, entity look-ups, paths and community lists. The
    cases: no tenants or ACLs (an anonymous caller); two tenants' worth of ACLs the caller
    holds every group of; and a document deleted since the snapshot (the community rule's
    part that still applies: no member changed through a deleted document)."""
    docs = env.corpus.docs
    caller = Caller()
    access: dict[str, Access] = dict.fromkeys(docs, OPEN)
    if case == "groups":
        access = {d: ("t1", ["g1"] if i % 2 else ["g2", "g3"]) for i, d in enumerate(docs)}
        caller = Caller(tenant="t1", groups=frozenset({"g1", "g3"}))
    await env.assign(access)
    behind = env.corpus.community_docs
    biggest = behind[max(behind, key=lambda cid: len(behind[cid]))]
    deleted = [min(biggest)] if case == "deleted" else []
    cases = [(q, m) for m in MODES for q in QUESTIONS[-4:]]
    leland = (await env.get(Caller.operator(), "/v1/entities", name="Leland")).json()
    leland_id = leland["entities"][0]["id"]

    async def observed() -> list[Any]:
        out: list[Any] = [_answers(await env.ask(caller, question=q, mode=m)) for q, m in cases]
        for path, params in (
            ("/v1/entities", {"name": "Leland"}),
            (f"/v1/entities/{leland_id}", {}),
            ("/v1/paths", {"from": "Leland", "to": "Maximum Overdrive"}),
            ("/v1/facts", {"from": "1000-01-01", "limit": "200"}),
            ("/v1/communities", {}),
        ):
            resp = await env.get(caller, path, **params)
            out.append((resp.status_code, resp.json()))
        return out

    async with env.engine.begin() as conn:
        await conn.execute(text("UPDATE documents SET deleted = doc_id = ANY(:g)"), {"g": deleted})
    try:
        async with env.engine.connect() as conn:
            assert (await widened(conn, caller)).whole_corpus
        fast = await observed()
        with monkeypatch.context() as patched:
            _filtered_reads_only(patched)
            slow = await observed()
    finally:
        async with env.engine.begin() as conn:
            await conn.execute(text("UPDATE documents SET deleted = false"))
        await env.assign(dict.fromkeys(docs, OPEN))
    assert fast == slow
    communities = fast[-1][1]["communities"]
    if case == "deleted":  # the rule removed something, or this case tests nothing
        assert len(communities) < len(
            (await env.get(caller, "/v1/communities")).json()["communities"]
        )


@HALF
@given(data=st.data())
async def test_graph_plans_count_only_what_the_caller_sees(env: Env, data: st.DataObject) -> None:
    """A typed plan's answer (POST /v1/graph/query) is exactly the reference's: the entities
    the caller's documents name, reached through relationships its documents evidence; every
    evidence sentence from a visible document (tests/support/plan_oracle.py)."""
    access, caller = data.draw(scenarios(env.corpus.docs), label="scenario")
    await env.assign(access)
    oracle = Oracle(env.corpus, caller, access)
    async with env.engine.connect() as conn:
        rows = await read_rows(conn)
    for who in (caller, Caller.operator()):
        plan = data.draw(plans(rows.surfaces, rows.types, rows.entity_types), "plan")
        env.box.caller = who
        resp = await env.client.post("/v1/graph/query", json=plan)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        want = plan_answer(rows, None if who.admin else oracle.docs, plan)
        event(f"plan answer: {'empty' if not want else 'some'}")
        assert answer["count"] == len(want), (plan, answer["notes"])
        if plan["result"]["op"] == "list":
            assert {r["id"] for r in answer["rows"]} == want
        for evidence in (e for r in answer["rows"] for e in r["evidence"]):
            if not who.admin:
                assert evidence["doc_id"] in oracle.docs
                oracle.no_hidden_text(evidence["sentence"])
