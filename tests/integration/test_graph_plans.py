"""Typed graph plans (issue 33) against a real database: each operation (count, list with
paging, group by type and by related entity, rank by degree and mentions, compare, negation,
a three-hop impact walk), the bounds (too broad, too long: refused with what to narrow), and
visibility (a restricted caller's plan counts only what its documents state, as if the hidden
documents had never been indexed). The corpus is v2 events with provided facts only
(extraction "provided"), so every fact is known."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import text

from services.client import AsyncClient
from services.core.access import Caller
from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.llm.client import process_client
from services.core.settings import Settings
from services.retrieval import graph_memory, plan_exec
from services.retrieval.errors import Invalid
from services.retrieval.graph_memory import MemoryGraph
from services.retrieval.llm import OpenAIChat
from services.retrieval.plans import Plan, PlanAnswer
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import build_query_service
from tests.conftest import Infra
from tests.integration.test_curations import ingest
from tests.support.api_client import api_client
from tests.support.cli import kgstream
from tests.support.graph import create_database, drop_database
from tests.support.openai_stub import OpenAIStub
from tests.support.plan_oracle import plan_answer, plans, read_rows
from tests.support.property_corpus import T0, Env

pytestmark = pytest.mark.integration

OPERATOR = Caller.operator()
ORG, LOC, PERSON = "ORG", "LOC", "PERSON"
# (doc_id, acl, entities (name, type), relationships (source, TYPE, target))
WORLD: list[tuple[str, list[str] | None, list[tuple[str, str]], list[tuple[str, str, str]]]] = [
    (
        "d-norvale",
        None,
        [("Norvale Components", ORG), ("APAC", LOC), ("Brightwater Motors", ORG)],
        [
            ("Norvale Components", "LOCATED_IN", "APAC"),
            ("Norvale Components", "SUPPLIES", "Brightwater Motors"),
        ],
    ),
    (
        "d-brightwater",
        None,
        [("Brightwater Motors", ORG), ("EMEA", LOC), ("Calder Fleet", ORG)],
        [
            ("Brightwater Motors", "LOCATED_IN", "EMEA"),
            ("Brightwater Motors", "SUPPLIES", "Calder Fleet"),
        ],
    ),
    (
        "d-calder",
        None,
        [("Calder Fleet", ORG), ("EMEA", LOC), ("Dunmore Rail", ORG)],
        [("Calder Fleet", "LOCATED_IN", "EMEA"), ("Calder Fleet", "SUPPLIES", "Dunmore Rail")],
    ),
    (
        "d-dunmore",
        None,
        [("Dunmore Rail", ORG), ("EMEA", LOC), ("Ada Quill", PERSON)],
        [("Dunmore Rail", "LOCATED_IN", "EMEA"), ("Ada Quill", "APPROVED", "Dunmore Rail")],
    ),
    (
        "d-kestrel",
        None,
        [("Kestrel Alloys", ORG), ("APAC", LOC), ("Brightwater Motors", ORG)],
        [
            ("Kestrel Alloys", "LOCATED_IN", "APAC"),
            ("Kestrel Alloys", "SUPPLIES", "Brightwater Motors"),
        ],
    ),
    # Only the legal group may read this one: its supplier and what it states.
    (
        "d-secret",
        ["legal"],
        [("Orrin Metals", ORG), ("APAC", LOC), ("Calder Fleet", ORG)],
        [("Orrin Metals", "LOCATED_IN", "APAC"), ("Orrin Metals", "SUPPLIES", "Calder Fleet")],
    ),
]
LEGAL = Caller(groups=frozenset({"legal"}))
OUTSIDER = Caller(groups=frozenset({"sales"}))


def events() -> list[dict[str, Any]]:
    out = []
    for n, (doc_id, acl, entities, rels) in enumerate(WORLD, 1):
        sentences = [f"{s} {t.lower().replace('_', ' ')} {o}." for s, t, o in rels]
        event: dict[str, Any] = {
            "schema_version": 2,
            "event_id": f"plan-{doc_id}",
            "type": "upsert",
            "doc_id": doc_id,
            "title": doc_id,
            "text": " ".join(sentences),
            "occurred_at": T0.replace(microsecond=n).isoformat(),
            "extraction": "provided",
            "entities": [{"name": name, "type": kind} for name, kind in entities],
            "relationships": [{"source": s, "target": o, "type": t} for s, t, o in rels],
        }
        if acl is not None:
            event["acl"] = acl
        out.append(event)
    return out


@pytest.fixture(scope="module")
def url(env: Env) -> Iterator[str]:
    made = create_database(env.server_url)
    yield made
    drop_database(made)


@pytest.fixture(scope="module")
async def built(env: Env, url: str) -> str:
    await ingest(env, url, events())
    return url


async def run(url: str, plan: dict[str, Any], caller: Caller = OPERATOR, **kw: Any) -> PlanAnswer:
    """The plan's answer, its steps read from the database, or walked on ``memory`` (a held
    graph) when given."""
    engine = make_engine(url)
    try:
        async with engine.connect() as conn, conn.begin():
            return await plan_exec.execute(
                conn,
                Plan.model_validate(plan),
                caller,
                snapshot_id=None,
                budget_s=kw.get("budget_s", 5.0),
                memory=kw.get("memory"),
            )
    finally:
        await engine.dispose()


async def held(url: str) -> MemoryGraph:
    """The graph as a query process holds it (graph_memory.build)."""
    engine = make_engine(url)
    try:
        return await graph_memory.build(engine)
    finally:
        await engine.dispose()


def names(answer: PlanAnswer) -> list[str]:
    return [r.name for r in answer.rows]


IN_APAC = {
    "start": {"names": ["APAC"]},
    "follow": [{"relationships": ["LOCATED_IN"], "direction": "in"}],
    "where": {"types": [ORG]},
}


async def test_count_and_list_what_the_caller_sees(built: str) -> None:
    everyone = await run(built, {**IN_APAC, "result": {"op": "count"}})
    assert everyone.count == 3  # Norvale, Kestrel, and Orrin for the operator
    assert [r.name for r in everyone.started_from] == ["APAC"]
    listed = await run(built, {**IN_APAC, "result": {"op": "list"}}, LEGAL)
    assert names(listed) == ["Kestrel Alloys", "Norvale Components", "Orrin Metals"]
    outsider = await run(built, {**IN_APAC, "result": {"op": "list"}}, OUTSIDER)
    assert outsider.count == 2
    assert names(outsider) == ["Kestrel Alloys", "Norvale Components"]
    for row in outsider.rows:  # each row says why, from a document the caller may read
        assert row.hops == 1
        [evidence] = row.evidence
        assert evidence.doc_id in {"d-norvale", "d-kestrel"}
        assert "located in APAC" in evidence.sentence
        assert evidence.relationship == "LOCATED_IN"
    assert not any("Orrin" in e.sentence for r in outsider.rows for e in r.evidence)


async def test_paging_keeps_one_order(built: str) -> None:
    plan = {**IN_APAC, "result": {"op": "list", "limit": 2}}
    first = await run(built, plan)
    second = await run(built, {**plan, "result": {"op": "list", "limit": 2, "offset": 2}})
    assert first.count == second.count == 3
    assert names(first) + names(second) == [
        "Kestrel Alloys",
        "Norvale Components",
        "Orrin Metals",
    ]


async def test_impact_three_hops_downstream(built: str) -> None:
    impact = {
        "start": {"names": ["Norvale Components"]},
        "follow": [{"relationships": ["SUPPLIES"], "direction": "out", "depth": 3}],
        "result": {"op": "list"},
    }
    answer = await run(built, impact)
    assert [(r.name, r.hops) for r in answer.rows] == [
        ("Brightwater Motors", 1),
        ("Calder Fleet", 2),
        ("Dunmore Rail", 3),
    ]
    shallow = {**impact, "follow": [{"relationships": ["SUPPLIES"], "depth": 2}]}
    assert names(await run(built, shallow)) == ["Brightwater Motors", "Calder Fleet"]
    # two steps: suppliers of Brightwater's customers' customers... then who approved them
    chained = {
        "start": {"names": ["Calder Fleet"]},
        "follow": [
            {"relationships": ["SUPPLIES"], "direction": "out"},
            {"relationships": ["APPROVED"], "direction": "in"},
        ],
        "result": {"op": "list"},
    }
    assert names(await run(built, chained)) == ["Ada Quill"]


async def test_negation_drops_what_is_related(built: str) -> None:
    in_emea = {
        "start": {"names": ["EMEA"]},
        "follow": [{"relationships": ["LOCATED_IN"], "direction": "in"}],
        "exclude": {
            "names": ["Brightwater Motors"],
            "relationships": ["SUPPLIES"],
            "direction": "out",
        },
        "result": {"op": "list"},
    }
    # Brightwater supplies Calder: Calder goes; Brightwater itself is named, so it goes too
    assert names(await run(built, in_emea)) == ["Dunmore Rail"]


async def test_group_by_type_and_by_related(built: str) -> None:
    near_calder = {
        "start": {"names": ["Calder Fleet"]},
        "follow": [{"direction": "both"}],
        "result": {"op": "group"},
    }
    answer = await run(built, near_calder, OUTSIDER)
    assert [(g.key, g.count, g.members) for g in answer.groups] == [
        ("ORG", 2, ["Brightwater Motors", "Dunmore Rail"]),
        ("LOC", 1, ["EMEA"]),
    ]
    by_region = {
        "start": {"types": [ORG]},
        "result": {
            "op": "group",
            "group_by": "related",
            "related": {"relationships": ["LOCATED_IN"], "direction": "out"},
        },
    }
    regions = await run(built, by_region, OUTSIDER)
    assert [(g.key, g.count) for g in regions.groups] == [("EMEA", 3), ("APAC", 2)]
    assert [(g.key, g.count) for g in (await run(built, by_region, LEGAL)).groups] == [
        ("APAC", 3),
        ("EMEA", 3),
    ]


async def test_rank_by_degree_and_mentions(built: str) -> None:
    suppliers = {
        "start": {"types": [ORG]},
        "result": {
            "op": "rank",
            "rank_by": "degree",
            "related": {"relationships": ["SUPPLIES"], "direction": "in"},
            "limit": 2,
        },
    }
    top = await run(built, suppliers, OUTSIDER)
    assert [(r.name, r.value) for r in top.rows] == [
        ("Brightwater Motors", 2.0),  # supplied by Norvale and Kestrel
        ("Calder Fleet", 1.0),  # Orrin's supply is hidden from this caller
    ]
    assert [(r.name, r.value) for r in (await run(built, suppliers, LEGAL)).rows] == [
        ("Brightwater Motors", 2.0),
        ("Calder Fleet", 2.0),
    ]
    mentioned = {
        "start": {"names": ["EMEA", "APAC"]},
        "result": {"op": "rank", "rank_by": "mentions"},
    }
    ranked = await run(built, mentioned, OUTSIDER)
    assert [(r.name, r.value) for r in ranked.rows] == [("EMEA", 3.0), ("APAC", 2.0)]
    with pytest.raises(Invalid, match="PageRank"):
        await run(built, {**mentioned, "result": {"op": "rank", "rank_by": "pagerank"}}, OUTSIDER)


async def test_compare_side_by_side(built: str) -> None:
    plan = {
        "start": {"names": ["Norvale Components", "Kestrel Alloys"]},
        "result": {"op": "compare"},
    }
    answer = await run(built, plan)
    assert answer.comparison is not None
    c = answer.comparison
    assert (c.a.entity.name, c.b.entity.name) == ("Norvale Components", "Kestrel Alloys")
    assert c.shared == ["LOCATED_IN out: APAC", "SUPPLIES out: Brightwater Motors"]
    assert c.only_a == c.only_b == []
    other = {
        "start": {"names": ["Norvale Components", "Orrin Metals"]},
        "result": {"op": "compare"},
    }
    assert (await run(built, other, LEGAL)).comparison is not None
    with pytest.raises(Invalid, match="names no entity you can see"):
        await run(built, other, OUTSIDER)


async def test_unknown_names_are_noted_not_guessed(built: str) -> None:
    plan = {"start": {"names": ["APAC", "Atlantis"]}, "result": {"op": "count"}}
    answer = await run(built, plan)
    assert answer.count == 1
    assert answer.notes == ["start: 'Atlantis' names no entity you can see"]
    hidden = await run(
        built, {"start": {"names": ["Orrin Metals"]}, "result": {"op": "count"}}, OUTSIDER
    )
    assert hidden.count == 0
    assert hidden.notes == ["start: 'Orrin Metals' names no entity you can see"]


async def test_bounds_refuse_with_what_to_narrow(
    built: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_exec, "MAX_REACHED", 2)
    with pytest.raises(Invalid, match="reach more than 2 entities"):
        await run(built, {"start": {"types": [ORG]}, "result": {"op": "count"}})
    monkeypatch.undo()
    with pytest.raises(Invalid, match="did not finish within"):
        await run(built, {**IN_APAC, "result": {"op": "count"}}, budget_s=1e-6)


async def test_types_filter_what_the_caller_sees_of_them(built: str) -> None:
    """A restricted caller's type of an entity is the commonest type its visible mentions give
    it (docs/access-control.md); here every mention agrees with the stored type."""
    engine = make_engine(built)
    try:
        async with engine.begin() as conn:
            stored = (
                await conn.execute(text("SELECT type FROM entities WHERE name = 'APAC'"))
            ).scalar_one()
    finally:
        await engine.dispose()
    assert stored == LOC
    for caller in (OPERATOR, OUTSIDER):
        plan = {"start": {"names": ["APAC"]}, "where": {"types": [LOC]}, "result": {"op": "list"}}
        assert names(await run(built, plan, caller)) == ["APAC"]
        plan = {"start": {"names": ["APAC"], "types": [ORG]}, "result": {"op": "list"}}
        assert names(await run(built, plan, caller)) == []


async def test_the_route_answers_under_the_keys_visibility(
    built: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    engine = make_engine(built)
    try:
        _, legal = await create_key(engine, ["query"], groups=["legal"], name="legal")
        _, sales = await create_key(engine, ["query"], groups=["sales"], name="sales")
        async with api_client(infra, built, engine, (embedder, extractor, cpu_pool)) as client:

            async def ask(key: str, plan: dict[str, Any], **params: str) -> httpx.Response:
                headers = {"Authorization": f"Bearer {key}"}
                return await client.post(
                    "/v1/graph/query", json=plan, headers=headers, params=params
                )

            plan = {**IN_APAC, "result": {"op": "list"}}
            seen = {}
            for key in (legal, sales):
                resp = await ask(key, plan)
                assert resp.status_code == 200, resp.text
                seen[key] = [r["name"] for r in resp.json()["rows"]]
            assert "Orrin Metals" in seen[legal]
            assert "Orrin Metals" not in seen[sales]
            # filters narrow the documents the plan reads, as on the other graph routes
            only = json.dumps({"occurred_at": {"gte": T0.replace(microsecond=5).isoformat()}})
            narrowed = await ask(legal, plan, filters=only)
            assert narrowed.status_code == 200, narrowed.text
            assert [r["name"] for r in narrowed.json()["rows"]] == [
                "Kestrel Alloys",
                "Orrin Metals",
            ]
            bad = await ask(legal, {"start": {"names": ["APAC"]}, "result": {"op": "drop"}})
            assert bad.status_code == 422
            too_long = await ask(
                legal, {**IN_APAC, "follow": [{"depth": 4}], "result": {"op": "count"}}
            )
            assert too_long.status_code == 422
            assert "less than or equal to 3" in too_long.text
            anonymous = await client.post("/v1/graph/query", json=plan)
            assert anonymous.status_code == 401
    finally:
        await engine.dispose()


async def test_cli_and_python_client(
    *,
    built: str,
    infra: Infra,
    tmp_path: Path,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    settings = Settings(home=tmp_path, database_url=built, kafka_bootstrap_servers=infra.bootstrap)
    plan = {**IN_APAC, "result": {"op": "list"}}
    done = await asyncio.to_thread(kgstream, settings, "graph", json.dumps(plan), "--json")
    assert done.returncode == 0, done.stderr
    answer = PlanAnswer.model_validate_json(done.stdout)
    assert names(answer) == ["Kestrel Alloys", "Norvale Components", "Orrin Metals"]
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps({**IN_APAC, "result": {"op": "count"}}))
    said = await asyncio.to_thread(kgstream, settings, "graph", f"@{saved}")
    assert said.returncode == 0, said.stderr
    assert said.stdout.startswith("[graph count] from APAC (LOC): 3 entities")
    bad = await asyncio.to_thread(kgstream, settings, "graph", '{"start": {}}')
    assert bad.returncode == 2
    assert "not a valid plan" in bad.stderr
    engine = make_engine(built)
    try:
        _, sales = await create_key(engine, ["query"], groups=["sales"], name="client")
        async with api_client(infra, built, engine, (embedder, extractor, cpu_pool)) as http:
            # the typed client, sent through the same in-process app
            transport = http._transport
            async with AsyncClient("http://api", api_key=sales, transport=transport) as client:
                seen = await client.graph_query(plan)
                assert names(seen) == ["Kestrel Alloys", "Norvale Components"]
                with pytest.raises(ValidationError):
                    await client.graph_query({"start": {}, "result": {"op": "count"}})
    finally:
        await engine.dispose()


GROUPS = ("legal", "sales", "ops")
NAMES = sorted({name for _, _, entities, _ in WORLD for name, _ in entities})
TYPES = sorted({rel for *_, rels in WORLD for _, rel, _ in rels})


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
async def test_any_plan_under_any_acls_equals_the_reference(
    built: str, data: st.DataObject
) -> None:
    """Drawn ACLs on these documents, whose entities recur across them (so a relationship can
    be hidden while both its ends stay visible), a drawn caller and plan: the answer is the
    reference's (tests/support/plan_oracle.py), and a restricted caller's evidence is from
    documents it may read."""
    acls = {
        doc: data.draw(st.none() | st.lists(st.sampled_from(GROUPS), min_size=1, max_size=2), doc)
        for doc, *_ in WORLD
    }
    caller = Caller(groups=frozenset(data.draw(st.sets(st.sampled_from(GROUPS)), "groups")))
    engine = make_engine(built)
    try:
        async with engine.begin() as conn:
            for doc, acl in acls.items():
                await conn.execute(
                    text("UPDATE documents SET acl = :a WHERE doc_id = :d"), {"a": acl, "d": doc}
                )
            rows = await read_rows(conn)
        readable = {d for d, acl in acls.items() if acl is None or caller.groups & set(acl)}
        plan = data.draw(plans(NAMES, TYPES, rows.entity_types), "plan")
        want = plan_answer(rows, readable, plan)
        event(
            f"readable: {len(readable)} of {len(WORLD)}; answer {'empty' if not want else 'some'}"
        )
        memory = await held(built)  # steps read from the database, then walked in memory
        for answer in (
            await run(built, plan, caller),
            await run(built, plan, caller, memory=memory),
        ):
            assert answer.count == len(want), (plan, answer.notes)
            if plan["result"]["op"] == "list":
                assert {r.id for r in answer.rows} == want
            assert all(e.doc_id in readable for r in answer.rows for e in r.evidence)
    finally:
        async with engine.begin() as conn:  # as built: only the secret document restricted
            await conn.execute(text("UPDATE documents SET acl = NULL"))
            await conn.execute(
                text("UPDATE documents SET acl = '{legal}' WHERE doc_id = 'd-secret'")
            )
        await engine.dispose()


async def test_questions_become_plans_in_graph_and_auto_mode(
    *,
    built: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    """POST /v1/query reads a question that states a plan as that plan (auto mode routes it),
    under the key's visibility; a question that states none is answered as before."""
    engine = make_engine(built)
    try:
        _, legal = await create_key(engine, ["query"], groups=["legal"], name="legal-q")
        _, sales = await create_key(engine, ["query"], groups=["sales"], name="sales-q")
        async with api_client(infra, built, engine, (embedder, extractor, cpu_pool)) as client:

            async def ask(key: str, question: str, mode: str = "auto") -> dict[str, Any]:
                headers = {"Authorization": f"Bearer {key}"}
                body = {"question": question, "mode": mode}
                resp = await client.post("/v1/query", json=body, headers=headers)
                assert resp.status_code == 200, resp.text
                data: dict[str, Any] = resp.json()
                return data

            counted = await ask(legal, "How many companies are located in APAC?")
            assert counted["mode_used"] == "graph"
            assert counted["answer"] == "3"
            assert counted["notes"][0] == "auto → graph: the question states a plan"
            assert counted["graph"]["plan"]["follow"][0]["relationships"] == ["LOCATED_IN"]
            assert (await ask(sales, "How many companies are located in APAC?"))["answer"] == "2"
            impact = await ask(legal, "What is affected if Norvale Components goes bankrupt?")
            assert impact["answer"] == "Brightwater Motors; Calder Fleet; Dunmore Rail"
            assert all(r["evidence"] for r in impact["graph"]["rows"])
            suppliers = await ask(sales, "Who supplies Calder Fleet?", mode="graph")
            assert suppliers["answer"] == "Brightwater Motors"  # Orrin's supply is hidden
            nothing = await ask(legal, "Which companies does Dunmore Rail supply?")
            assert nothing["mode_used"] != "graph"  # the plan reached nothing: routed as before
            assert "graph: the plan reached nothing; answered as routed" in nothing["notes"][0]
            plain = await ask(legal, "Tell me about Norvale Components.")
            assert plain["mode_used"] != "graph"
            fallback = await ask(legal, "Tell me about Norvale Components.", mode="graph")
            assert fallback["mode_used"] == "local"
            assert fallback["notes"][0].startswith("graph: the question names no entity")
    finally:
        await engine.dispose()


async def test_with_an_llm_the_model_writes_the_plan(
    *,
    built: str,
    openai_stub: OpenAIStub,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    """With an LLM, the model writes the plan (through the real openai client to the local
    OpenAI-compatible server), which is validated and executed like any other; a plan that
    does not validate leaves the question to the rules, with a note."""
    written: list[dict[str, Any]] = []

    def answer(body: dict[str, Any]) -> str:
        system = str(body["messages"][0]["content"])
        if not system.startswith("You turn a question about a knowledge graph"):
            return json.dumps({"mode": "local", "reason": "stub", "sources": []})
        return json.dumps({"plan": written.pop(0)})

    openai_stub.chat_handler = answer
    client = process_client(Settings(openai_base_url=openai_stub.base_url, llm_max_attempts=1))
    assert client is not None
    engine = make_engine(built)
    service = build_query_service(Settings(), engine, embedder, extractor, cpu_pool)
    service = replace(service, llm=OpenAIChat(client, "stub-chat", 1))
    try:
        question = "Which suppliers feed Brightwater Motors, and how many are there?"
        written.append(
            {
                "start": {"names": ["Brightwater Motors"]},
                "follow": [{"relationships": ["SUPPLIES"], "direction": "in"}],
                "result": {"op": "count"},
            }
        )
        resp = await service.query(QueryRequest(question=question, mode="graph"), LEGAL)
        assert resp.mode_used == "graph"
        assert resp.answer == "2"
        assert resp.tokens["calls"] >= 1
        prompts = [
            str(r.body["messages"][1]["content"])
            for r in openai_stub.requests_to("/chat/completions")
        ]
        assert "Relationship types: APPROVED, LOCATED_IN, SUPPLIES" in prompts[-1]
        assert "Brightwater Motors" in prompts[-1]
        # an invalid plan (depth 9): the rules read the question instead
        written.append(
            {
                "start": {"names": ["Kestrel Alloys"]},
                "follow": [{"depth": 9}],
                "result": {"op": "list"},
            }
        )
        resp = await service.query(
            QueryRequest(question="Who supplies Brightwater Motors?", mode="graph"), LEGAL
        )
        assert resp.mode_used == "graph"
        assert resp.answer == "Kestrel Alloys; Norvale Components"
        assert resp.notes[0].startswith("graph: the model's plan is invalid (follow.0.depth")
    finally:
        openai_stub.chat_handler = None
        await engine.dispose()


async def test_auto_mode_goes_on_when_its_plan_is_refused(
    *,
    built: str,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan auto mode proposes and the bounds refuse is rolled back (its aborted statement
    and statement_timeout with it) and the question answered as routed; asked for in graph
    mode, the refusal is the answer."""
    monkeypatch.setattr(plan_exec, "MAX_REACHED", 1)
    engine = make_engine(built)
    service = build_query_service(Settings(), engine, embedder, extractor, cpu_pool)
    try:
        question = "How many companies are located in APAC?"
        resp = await service.query(QueryRequest(question=question, mode="auto"), LEGAL)
        assert resp.mode_used != "graph"
        assert resp.contexts  # the routed mode read passages in the same transaction
        assert resp.notes[0].startswith("graph: plan too broad; answered as routed")
        with pytest.raises(Invalid, match="reach more than 1 entities"):
            await service.query(QueryRequest(question=question, mode="graph"), LEGAL)
    finally:
        await engine.dispose()


async def test_where_has_and_lacks_a_relationship(built: str) -> None:
    """Roles a description states and the graph shows ("the vendors": those that supply
    something) and absences ("supplies nothing") as filters, as the caller sees relationships."""
    vendors = {
        **IN_APAC,
        "where": {"types": [ORG], "has": {"relationships": ["SUPPLIES"], "direction": "out"}},
        "result": {"op": "list"},
    }
    assert names(await run(built, vendors, LEGAL)) == [
        "Kestrel Alloys",
        "Norvale Components",
        "Orrin Metals",
    ]
    assert names(await run(built, vendors, OUTSIDER)) == ["Kestrel Alloys", "Norvale Components"]
    idle = {
        "start": {"names": ["EMEA"]},
        "follow": [{"relationships": ["LOCATED_IN"], "direction": "in"}],
        "where": {"lacks": {"relationships": ["SUPPLIES"], "direction": "out"}},
        "result": {"op": "list"},
    }
    assert names(await run(built, idle)) == ["Dunmore Rail"]
    unsupplied = {
        "start": {"types": [ORG]},
        "where": {"lacks": {"relationships": ["SUPPLIES"], "direction": "in"}},
        "result": {"op": "count"},
    }
    # Norvale, Kestrel and Orrin are supplied by nobody; for the outsider Calder's supplier
    # Orrin is hidden but Brightwater still supplies it, and Orrin is not there to count
    assert (await run(built, unsupplied, LEGAL)).count == 3
    assert (await run(built, unsupplied, OUTSIDER)).count == 2
    # to entities of a type only: in EMEA, only Dunmore Rail has a person related to it
    person = {"typed": True, "direction": "both", "to_types": [PERSON]}
    in_emea = {
        "start": {"names": ["EMEA"]},
        "follow": [{"relationships": ["LOCATED_IN"], "direction": "in"}],
    }
    unapproved = {**in_emea, "where": {"lacks": person}, "result": {"op": "list"}}
    assert names(await run(built, unapproved)) == ["Brightwater Motors", "Calder Fleet"]
    approved = {**in_emea, "where": {"has": person}, "result": {"op": "list"}}
    assert names(await run(built, approved)) == ["Dunmore Rail"]
    ranked = {
        **in_emea,
        "result": {"op": "rank", "related": {"direction": "both", "to_types": [ORG]}},
    }
    top = (await run(built, ranked)).rows  # Brightwater and Calder: a customer and a supplier
    assert [(r.name, r.value) for r in top] == [
        ("Brightwater Motors", 3.0),
        ("Calder Fleet", 3.0),
        ("Dunmore Rail", 1.0),
    ]


async def test_a_hidden_relationship_is_neither_had_nor_counted(built: str) -> None:
    """Brightwater stays visible (two open documents name it) while the only document that
    says it supplies Calder is hidden: to the outsider it supplies nothing."""
    engine = make_engine(built)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE documents SET acl = '{legal}' WHERE doc_id = 'd-brightwater'")
            )
        suppliers = {
            "start": {"types": [ORG]},
            "where": {"has": {"relationships": ["SUPPLIES"], "direction": "out"}},
            "result": {"op": "list"},
        }
        assert "Brightwater Motors" in names(await run(built, suppliers, LEGAL))
        seen = names(await run(built, suppliers, OUTSIDER))
        assert seen == ["Calder Fleet", "Kestrel Alloys", "Norvale Components"]
        ranked = {
            "start": {"names": ["Brightwater Motors"]},
            "result": {
                "op": "rank",
                "related": {"relationships": ["SUPPLIES"], "direction": "out"},
            },
        }
        assert [r.value for r in (await run(built, ranked, OUTSIDER)).rows] == [0.0]
    finally:
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE documents SET acl = NULL WHERE doc_id = 'd-brightwater'")
            )
        await engine.dispose()


EVERY_OP: list[dict[str, Any]] = [
    {**IN_APAC, "result": {"op": "count"}},
    {**IN_APAC, "result": {"op": "list", "limit": 2, "offset": 1}},
    {
        "start": {"names": ["Norvale Components"]},
        "follow": [{"relationships": ["SUPPLIES"], "depth": 3}],
        "result": {"op": "list"},
    },
    {
        "start": {"types": [ORG]},
        "where": {"lacks": {"relationships": ["SUPPLIES"], "direction": "in"}},
        "result": {"op": "list"},
    },
    {
        "start": {"names": ["EMEA", "APAC"]},
        "follow": [{"typed": True, "direction": "both"}],
        "where": {"has": {"direction": "both", "to_types": [PERSON]}},
        "result": {"op": "list"},
    },
    {
        "start": {"types": [ORG]},
        "result": {
            "op": "group",
            "group_by": "related",
            "related": {"relationships": ["LOCATED_IN"]},
        },
    },
    {"start": {"types": [ORG]}, "result": {"op": "rank", "rank_by": "degree"}},
    {
        "start": {"types": [ORG]},
        "exclude": {"names": ["Brightwater Motors"], "relationships": ["SUPPLIES"]},
        "result": {"op": "list"},
    },
    {"start": {"names": ["Calder Fleet", "Brightwater Motors"]}, "result": {"op": "compare"}},
]


@pytest.mark.parametrize(
    "caller", [OPERATOR, LEGAL, OUTSIDER], ids=["operator", "legal", "outsider"]
)
async def test_steps_walked_in_memory_answer_as_the_database(built: str, caller: Caller) -> None:
    """Every operation, its steps walked on the held graph (POST /v1/graph/query and the query
    service do when the read may), answers exactly as when they are read from the database,
    whoever asks; only the round trips differ."""
    memory = await held(built)
    for plan in EVERY_OP:
        from_db = await run(built, plan, caller)
        walked = await run(built, plan, caller, memory=memory)
        assert walked.statements < from_db.statements, plan
        same = {"statements": 0}
        assert walked.model_copy(update=same) == from_db.model_copy(update=same), plan
