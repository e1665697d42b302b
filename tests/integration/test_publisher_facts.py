"""Facts from the publisher (document event v2) against a real database and the real offline
models: provided entities resolve like extracted ones, across documents; a new version
replaces them and a delete removes them; a curation's apply writes them again; a restricted
caller sees them only through documents it may read; and every graph equals a rebuild of the
surviving documents."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from services.indexer.deps import IndexerDeps
from services.indexer.handlers import handle_record
from tests.conftest import Infra
from tests.integration.test_curations import apply, ingest, rebuilt_with_rules, rule
from tests.support.api_client import api_client
from tests.support.graph import (
    canonical_graph,
    create_database,
    drop_database,
    graph_diff,
    scalar,
    tenant_graph,
    to_record,
)
from tests.support.property_corpus import T0, Env, SentenceChunker

pytestmark = pytest.mark.integration

_ids = iter(range(1, 1_000_000))


@pytest.fixture
def url(env: Env) -> Iterator[str]:
    """A fresh database from the migrated template, dropped after the test."""
    made = create_database(env.server_url)
    yield made
    drop_database(made)


ACME = {"name": "Acme Corp", "type": "ORG", "aliases": ["Acme Industries"]}
ROE = {"name": "Jane Roe", "type": "PERSON", "description": "Buyer at Acme."}
WORKS_AT = {"source": "Jane Roe", "target": "Acme Industries", "type": "WORKS_AT"}


def event(doc_id: str, text: str, **facts: Any) -> dict[str, Any]:
    """An upsert, newer than every event made before it; v2 when it has facts."""
    n = next(_ids)
    out: dict[str, Any] = {
        "event_id": f"{doc_id}-{n}",
        "type": "upsert",
        "doc_id": doc_id,
        "title": f"Record {doc_id}",
        "text": text,
        "occurred_at": T0.replace(microsecond=n).isoformat(),
    }
    return {"schema_version": 2, **out, **facts} if facts else out


def delete(doc_id: str) -> dict[str, Any]:
    n = next(_ids)
    return {
        "event_id": f"{doc_id}-{n}",
        "type": "delete",
        "doc_id": doc_id,
        "occurred_at": T0.replace(microsecond=n).isoformat(),
    }


def rows(url: str, sql: str, **params: Any) -> list[Any]:
    aggregated = f"SELECT array_agg(x ORDER BY x) FROM ({sql}) q(x)"  # noqa: S608 - tests' SQL
    return list(scalar(url, aggregated, **params) or [])


def mentions(url: str, origin: str) -> list[str]:
    """'doc: surface -> entity' for every mention of that origin."""
    return rows(
        url,
        "SELECT m.doc_id || ': ' || m.surface || ' -> ' || e.name FROM mentions m"
        " JOIN entities e ON e.id = m.entity_id WHERE m.origin = :o",
        o=origin,
    )


def edges(url: str) -> list[str]:
    """'source TYPE target (origin of each piece of evidence)' for every relationship that is
    not a co-occurrence."""
    return rows(
        url,
        "SELECT s.name || ' ' || r.type || ' ' || t.name || ' ('"
        " || string_agg(v.origin, ',' ORDER BY v.origin) || ')'"
        " FROM relationships r JOIN entities s ON s.id = r.source_id"
        " JOIN entities t ON t.id = r.target_id"
        " JOIN relationship_evidence v ON v.relationship_id = r.id"
        " WHERE r.type <> 'co_occurs' GROUP BY s.name, r.type, t.name",
    )


async def equals_rebuild(env: Env, url: str, survivors: list[dict[str, Any]]) -> None:
    got = canonical_graph(url)
    want = await rebuilt_with_rules(env, [], survivors)
    assert got == want, graph_diff(got, want)


# "provided": the extractor never reads the text (the memo would hold it), yet it is chunked
# and embedded; "auto": extracted, and the facts added.
def order(doc_id: str, text: str, **facts: Any) -> dict[str, Any]:
    """An order naming Acme and its buyer, who works there."""
    return event(doc_id, text, entities=[ACME, ROE], relationships=[WORKS_AT], **facts)


ORDER = order("doc-order", "Purchase order 7 covers ten brass valves.", extraction="provided")
NEWS = event(
    "doc-news",
    "Acme Corp opened a factory in Ohio.",
    entities=[{"name": "Ohio", "type": "GPE"}, {"name": "Acme", "type": "ORG"}],
    relationships=[{"source": "Acme", "target": "Ohio", "type": "OPERATES_IN", "weight": 0.5}],
)
MEMO = event("doc-memo", "Jane Roe approved the order.")  # v1: extracted only


async def test_provided_facts_resolve_across_documents_and_with_extracted_ones(
    env: Env, url: str
) -> None:
    await ingest(env, url, [ORDER, NEWS, MEMO])
    assert ORDER["text"] not in env.extractor.cache
    assert scalar(url, "SELECT count(*) FROM chunks WHERE doc_id = 'doc-order'") == 1
    assert scalar(url, "SELECT count(*) FROM token_usage WHERE doc_id = 'doc-order'") == 0
    # One Acme, named by the publisher of two documents and by the extractor.
    assert rows(url, "SELECT name FROM entities WHERE name LIKE 'Acme%'") == ["Acme Corp"]
    assert mentions(url, "publisher") == [
        "doc-news: Acme -> Acme Corp",
        "doc-news: Ohio -> Ohio",
        "doc-order: Acme Corp -> Acme Corp",
        "doc-order: Acme Industries -> Acme Corp",
        "doc-order: Jane Roe -> Jane Roe",
    ]
    extracted = mentions(url, "extracted")
    assert "doc-news: Acme Corp -> Acme Corp" in extracted
    assert "doc-memo: Jane Roe -> Jane Roe" in extracted
    assert not [m for m in extracted if m.startswith("doc-order: ") and "Record" not in m]
    acme_aliases = rows(
        url,
        "SELECT alias FROM aliases a JOIN entities e ON e.id = a.entity_id"
        " WHERE e.name = 'Acme Corp'",
    )
    assert acme_aliases == ["Acme", "Acme Corp", "Acme Industries"]
    assert "Jane Roe WORKS_AT Acme Corp (publisher)" in edges(url)
    assert "Acme Corp OPERATES_IN Ohio (publisher)" in edges(url)
    assert scalar(
        url, "SELECT weight FROM relationships WHERE type = 'OPERATES_IN'"
    ) == pytest.approx(0.5)
    assert "Buyer at Acme." in scalar(
        url, "SELECT description FROM entities WHERE name = 'Jane Roe'"
    )
    # Arrival order does not matter: the same graph from the other end.
    await equals_rebuild(env, url, [MEMO, NEWS, ORDER])


async def test_a_new_version_replaces_the_facts_and_a_delete_removes_them(
    env: Env, url: str
) -> None:
    news = event(
        "doc-news2",
        "Acme Corp opened a factory in Ohio.",
        entities=[{"name": "Acme Corp", "type": "ORG"}],
    )
    first = order("doc-order2", "Purchase order 8 covers two pumps.")
    await ingest(env, url, [news, first])
    assert "Jane Roe WORKS_AT Acme Corp (publisher)" in edges(url)
    # The same text, other facts: applied (the facts are part of the content), Jane Roe's
    # only support goes, and so does her relationship.
    bolt = {"name": "Bolt Works", "type": "ORG"}
    supplied = {"source": "Acme Corp", "target": "Bolt Works", "type": "SUPPLIED_BY"}
    order2 = event(
        "doc-order2",
        first["text"],
        entities=[{"name": "Acme Corp", "type": "ORG"}, bolt],
        relationships=[supplied],
    )
    async with env.deps(url) as deps:
        assert await handle_record(deps, to_record(order2)) == "applied"
    assert rows(url, "SELECT name FROM entities WHERE name = 'Jane Roe'") == []
    assert "Acme Corp SUPPLIED_BY Bolt Works (publisher)" in edges(url)
    assert not [e for e in edges(url) if "WORKS_AT" in e]
    assert rows(url, "SELECT alias FROM aliases WHERE alias = 'Acme Industries'") == []
    await equals_rebuild(env, url, [news, order2])
    # The same event again with a new id and time: nothing changed.
    again = dict(order2, event_id="again", occurred_at=T0.replace(microsecond=999_999).isoformat())
    async with env.deps(url) as deps:
        assert await handle_record(deps, to_record(again)) == "unchanged"
    # A delete takes them with the document; Acme stays, the other document names it.
    assert await env.build(url, [delete("doc-order2")]) == ["deleted"]
    assert mentions(url, "publisher") == ["doc-news2: Acme Corp -> Acme Corp"]
    assert rows(url, "SELECT name FROM entities WHERE name = 'Bolt Works'") == []
    assert scalar(url, "SELECT facts FROM documents WHERE doc_id = 'doc-order2'") is None
    await equals_rebuild(env, url, [news])


async def test_switching_to_provided_drops_what_was_extracted(env: Env, url: str) -> None:
    text = "Jane Roe met Richard Nixon in Ohio."
    extracted = event("doc-switch", text)
    await ingest(env, url, [extracted])
    assert "doc-switch: Richard Nixon -> Richard Nixon" in mentions(url, "extracted")
    # The same text, not to be extracted any more: the document changes, and only its title's
    # node and the provided fact are left.
    provided = event("doc-switch", text, extraction="provided", entities=[ROE])
    await ingest(env, url, [provided])
    assert mentions(url, "extracted") == ["doc-switch: Record doc-switch -> Record doc-switch"]
    assert mentions(url, "publisher") == ["doc-switch: Jane Roe -> Jane Roe"]
    await equals_rebuild(env, url, [provided])


async def test_facts_follow_the_first_chunk_of_a_document_without_title(env: Env, url: str) -> None:
    """Review finding: without a title, cutting a lead-in made an old later chunk the first
    one, unchanged by hash, so the facts (on the old first chunk) were deleted and not written
    again; adding one kept them twice. The first chunk's hash now says it is first."""
    facts = {"entities": [ACME, ROE], "relationships": [WORKS_AT]}
    body = "Acme Corp makes brass valves. Jane Roe buys them."
    versions = [
        {k: v for k, v in event("doc-bare", f"A lead-in. {body}", **facts).items() if k != "title"},
        {k: v for k, v in event("doc-bare", body, **facts).items() if k != "title"},
        {
            k: v
            for k, v in event("doc-bare", f"New lead-in. {body}", **facts).items()
            if k != "title"
        },
    ]
    expected = ["doc-bare: Acme Corp -> Acme Corp", "doc-bare: Acme Industries -> Acme Corp"]
    expected.append("doc-bare: Jane Roe -> Jane Roe")
    for version in versions:
        await ingest(env, url, [version])
        assert mentions(url, "publisher") == expected
        await equals_rebuild(env, url, [version])


async def test_a_curation_apply_writes_the_provided_facts_again(env: Env, url: str) -> None:
    first = order("doc-order3", "Purchase order 9 covers one boiler.", extraction="provided")
    memo = event("doc-memo3", "Jane Roe approved the order.")
    await ingest(env, url, [first, memo])
    before = mentions(url, "publisher")
    await rule(url, "rename", "Jane Roe", "Jane Q. Roe")
    await apply(env, url)
    assert mentions(url, "publisher") == [
        m.replace("-> Jane Roe", "-> Jane Q. Roe") for m in before
    ]
    assert "Jane Q. Roe WORKS_AT Acme Corp (publisher)" in edges(url)
    assert first["text"] not in env.extractor.cache  # still not extracted
    got = canonical_graph(url)
    want = await rebuilt_with_rules(env, [("rename", "Jane Roe", "Jane Q. Roe")], [first, memo])
    assert got == want, graph_diff(got, want)


async def test_a_bad_fact_is_dead_lettered_with_its_reason(env: Env, url: str) -> None:
    letters: list[bytes] = []

    async def collect(key: bytes | None, value: bytes) -> None:
        letters.append(value)

    engine = make_engine(url)
    try:
        deps = IndexerDeps.from_settings(
            Settings(),
            engine=engine,
            embedder=env.embedder,
            extractor=env.extractor,
            executor=env.pool,
            publish_dead_letter=collect,
            chunker=SentenceChunker(),
        )
        dangling = event("doc-bad", "Text.", entities=[ROE], relationships=[WORKS_AT])
        empty = dict(event("doc-empty", "", entities=[ROE]), title="")
        for bad in (dangling, empty):
            assert await handle_record(deps, to_record(bad)) == "dead_lettered"
        reasons = rows(url, "SELECT reason || ': ' || detail FROM dead_letters")
        assert reasons == [
            "contract_violation: $.entities: a document with neither title nor text carries"
            " no facts",
            "contract_violation: $.relationships[0].target: 'Acme Industries' names no entity"
            " of this event (an entity's name or alias)",
        ]
        assert len(letters) == 2
        assert scalar(url, "SELECT count(*) FROM entities") == 0
    finally:
        await engine.dispose()


async def test_provided_facts_are_visible_only_through_their_document(
    *,
    env: Env,
    url: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    engine = make_engine(url)
    try:
        secret = dict(
            event(
                "doc-secret",
                "Acme Corp signed the contract.",
                entities=[ACME, {"name": "Zephyr Holdings", "type": "ORG"}],
                relationships=[
                    {"source": "Acme Corp", "target": "Zephyr Holdings", "type": "ACQUIRED_BY"}
                ],
            ),
            acl=["finance"],
        )
        public = event("doc-public", "Acme Corp opened a factory in Ohio.")
        await ingest(env, url, [secret, public])
        _, finance = await create_key(engine, ["query"], groups=["finance"], name="finance")
        _, sales = await create_key(engine, ["query"], groups=["sales"], name="sales")
        models = (embedder, extractor, cpu_pool)
        async with api_client(infra, url, engine, models) as client:

            async def seen(key: str) -> tuple[list[str], list[str], list[str]]:
                """(entities named Zephyr, Acme's aliases, its relations) as ``key`` sees them."""
                headers = {"Authorization": f"Bearer {key}"}
                found = await client.get(
                    "/v1/entities", params={"name": "Zephyr Holdings"}, headers=headers
                )
                assert found.status_code == 200, found.text
                zephyr = [e["name"] for e in found.json()["entities"] if "Zephyr" in e["name"]]
                acme = await client.get(
                    "/v1/entities", params={"name": "Acme Corp"}, headers=headers
                )
                (entity,) = [e for e in acme.json()["entities"] if e["name"] == "Acme Corp"]
                detail = await client.get(f"/v1/entities/{entity['id']}", headers=headers)
                assert detail.status_code == 200, detail.text
                relations = sorted(n["relation"] for n in detail.json()["neighbours"])
                return zephyr, sorted(entity["aliases"]), relations

            zephyr, aliases, relations = await seen(finance)
            assert zephyr == ["Zephyr Holdings"]
            assert "Acme Industries" in aliases
            assert "ACQUIRED_BY" in relations
            zephyr, aliases, relations = await seen(sales)
            assert zephyr == []
            assert "Acme Industries" not in aliases
            assert "ACQUIRED_BY" not in relations
    finally:
        await engine.dispose()


HELIOS = {"name": "Helios Dynamics", "type": "ORG", "aliases": ["Kadalu Turbines"]}


def named_with(url: str, doc_id: str, surface: str) -> list[str]:
    """The documents that mention the entity a document's ``surface`` resolved to."""
    return rows(
        url,
        "SELECT DISTINCT o.doc_id FROM mentions m JOIN mentions o ON o.entity_id = m.entity_id"
        " WHERE m.doc_id = :d AND m.surface = :s",
        d=doc_id,
        s=surface,
    )


KADALU = {"name": "Kadalu Turbines", "type": "ORG"}


async def test_another_tenants_alias_does_not_steer_resolution(
    *,
    env: Env,
    url: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    """Issue 30, finding 4: tenant t2's publisher gave Helios Dynamics the alias Kadalu
    Turbines, and t1's later memo naming Kadalu Turbines resolved into Helios Dynamics (one
    entity: t2's sentence in its description, its counts in t1's). Resolution is per tenant:
    t1's memo makes t1's own Kadalu Turbines, t1's part of the graph is what its memo alone
    gives, and each key finds only its own tenant's entity."""
    claim = event("doc-helios", "Helios Dynamics builds turbines.", entities=[HELIOS])
    memo = event("doc-kadalu", "Kadalu Turbines shipped the rotor.", entities=[KADALU])
    claim["tenant"], memo["tenant"] = "t2", "t1"
    await ingest(env, url, [claim, memo])
    assert named_with(url, "doc-kadalu", "Kadalu Turbines") == ["doc-kadalu"], (
        "t1's Kadalu Turbines is t2's entity too"
    )
    alone = create_database(env.server_url)
    try:
        await ingest(env, alone, [dict(memo, event_id="alone")])
        got, want = tenant_graph(url, "t1"), tenant_graph(alone, "t1")
    finally:
        drop_database(alone)
    assert got == want, graph_diff(got, want)
    engine = make_engine(url)
    try:
        _, t1 = await create_key(engine, ["query"], tenant="t1", name="t1")
        _, t2 = await create_key(engine, ["query"], tenant="t2", name="t2")
        async with api_client(infra, url, engine, (embedder, extractor, cpu_pool)) as client:

            async def found(key: str, name: str) -> list[tuple[str, list[str]]]:
                """(name, aliases) of the entities ``key`` finds by ``name``."""
                got = await client.get(
                    "/v1/entities",
                    params={"name": name},
                    headers={"Authorization": f"Bearer {key}"},
                )
                assert got.status_code == 200, got.text
                return [(e["name"], sorted(e["aliases"])) for e in got.json()["entities"]]

            assert await found(t1, "Kadalu Turbines") == [("Kadalu Turbines", ["Kadalu Turbines"])]
            assert await found(t1, "Helios Dynamics") == []
            helios = ("Helios Dynamics", ["Helios Dynamics", "Kadalu Turbines"])
            assert await found(t2, "Kadalu Turbines") == [helios]
    finally:
        await engine.dispose()


async def test_a_document_given_to_another_tenant_is_resolved_in_its_scope(
    env: Env, url: str
) -> None:
    """The same content under another tenant is written anew in that tenant's scope: every
    chunk resolved again (here into t1's Helios Dynamics, whose alias it names), nothing left
    in the old scope, and t1's graph is what its documents alone give."""
    helios = event("doc-helios1", "Helios Dynamics builds turbines.", entities=[HELIOS])
    news = event("doc-news3", "Kadalu Turbines opened a plant.", entities=[KADALU])
    helios["tenant"], news["tenant"] = "t1", "t2"
    await ingest(env, url, [helios, news])
    assert named_with(url, "doc-news3", "Kadalu Turbines") == ["doc-news3"]
    moved = dict(event("doc-news3", news["text"], entities=[KADALU]), tenant="t1")
    async with env.deps(url) as deps:
        assert await handle_record(deps, to_record(moved)) == "applied"
    assert named_with(url, "doc-news3", "Kadalu Turbines") == ["doc-helios1", "doc-news3"]
    assert not any(tenant_graph(url, "t2").values()), "left in the old tenant's scope"
    alone = create_database(env.server_url)
    try:
        await ingest(env, alone, [dict(helios, event_id="a1"), dict(moved, event_id="a2")])
        got, want = tenant_graph(url, "t1"), tenant_graph(alone, "t1")
    finally:
        drop_database(alone)
    assert got == want, graph_diff(got, want)
    assert scalar(url, "SELECT count(DISTINCT tenant) FROM entities") == 1
