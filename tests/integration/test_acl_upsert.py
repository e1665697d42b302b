"""Access changes take effect at once, through the real indexer: an ACL or tenant change
delivered as an upsert with unchanged content (visibility is read live from ``documents``, so
a new ACL re-indexes nothing; a new tenant writes the document anew in that tenant's scope, as
entities are per tenant), and a deleted restricted document whose text may still be in a
published community summary (withheld from everyone)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text

from services.core.access import Caller
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from services.indexer.deps import IndexerDeps, RawRecord
from services.indexer.handlers import handle_batch
from services.retrieval.global_mode import list_communities
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import QueryService, build_query_service
from services.retrieval.snapshot import read_snapshot
from services.retrieval.visibility import entity_facts
from tests.support.query_fixtures import SAMPLE

pytestmark = pytest.mark.integration
LELAND = "hotpotqa-aebaeed5d73f"
OVERDRIVE = "hotpotqa-d50de2bed6aa"
QUESTION = "Who directed the film that was shot in or around Leland, North Carolina in 1986"


def _event(n: int, doc_id: str = LELAND, **access: Any) -> RawRecord:
    lines = (SAMPLE / "events.jsonl").read_text(encoding="utf-8").splitlines()
    event = next(e for e in map(json.loads, lines) if e["doc_id"] == doc_id)
    event.pop("version", None)  # the content hash decides: the text is the same every time
    event |= {"event_id": f"acl-change-{n}", "occurred_at": datetime(2025, 1, n, tzinfo=UTC)}
    event["occurred_at"] = event["occurred_at"].isoformat()
    event |= {k: v for k, v in access.items() if v is not None}  # absent: no ACL, no tenant
    return RawRecord("acl", 0, n, doc_id.encode(), json.dumps(event).encode())


async def _sees(service: QueryService, caller: Caller) -> bool:
    resp = await service.query(QueryRequest(question=QUESTION, mode="local", k=5), caller)
    in_contexts = any(c.doc_id == LELAND for c in resp.contexts)
    async with read_snapshot(service.engine) as (conn, _):
        entities = await conn.scalars(
            text("SELECT DISTINCT entity_id FROM mentions WHERE doc_id = :d"), {"d": LELAND}
        )
        visible = await entity_facts(conn, caller, list(entities))
    assert in_contexts == bool(visible), "contexts and entities disagree"
    return in_contexts


async def _chunk_ids(service: QueryService) -> list[int]:
    async with service.engine.connect() as conn:
        ids = await conn.scalars(text("SELECT id FROM chunks ORDER BY id"))
        return list(ids)


@pytest.fixture
def service(
    settings: Settings,
    deps: IndexerDeps,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> QueryService:
    """A query service on the indexer's fresh database."""
    return build_query_service(settings, deps.engine, embedder, extractor, cpu_pool)


async def test_acl_change_on_upsert_takes_effect_without_rebuild(
    deps: IndexerDeps, service: QueryService
) -> None:
    hr, sales = Caller(groups=frozenset({"hr"})), Caller(groups=frozenset({"sales"}))
    assert await handle_batch(deps, [_event(1, acl=["hr"])]) == ["applied"]
    chunks = await _chunk_ids(service)
    assert await _sees(service, hr)
    assert not await _sees(service, sales)

    assert await handle_batch(deps, [_event(2, acl=["sales"])]) != ["dead_lettered"]
    assert await _sees(service, sales)
    assert not await _sees(service, hr)

    assert await _chunk_ids(service) == chunks, "same content: nothing was re-indexed"

    assert await handle_batch(deps, [_event(3, tenant="acme")]) == ["applied"]
    assert await _sees(service, Caller(tenant="acme"))
    assert not await _sees(service, sales)
    assert await _sees(service, Caller.operator())
    # A new tenant: the same chunks written anew, resolved in the tenant's scope.
    assert len(await _chunk_ids(service)) == len(chunks)
    assert not set(await _chunk_ids(service)) & set(chunks)
    async with service.engine.connect() as conn:
        scopes = await conn.scalars(text("SELECT DISTINCT tenant FROM entities"))
        assert list(scopes) == ["acme"]


async def _publish(service: QueryService, communities: dict[int, str]) -> int:
    """A published snapshot at the current watermark: community id -> members' doc (or '*')."""
    async with service.engine.begin() as conn:
        snapshot_id = int(
            await conn.scalar(
                text(
                    "INSERT INTO snapshots (status, watermark, published_at) VALUES ('published',"
                    " (SELECT coalesce(max(id), 0) FROM graph_changes), now()) RETURNING id"
                )
            )
            or 0
        )
        for cid, doc in communities.items():
            await conn.execute(
                text(
                    "INSERT INTO communities (snapshot_id, id, level, size, fingerprint, title,"
                    " summary) VALUES (:s, :c, 0, 0, 'fp', 'films', 'written from both documents')"
                ),
                {"s": snapshot_id, "c": cid},
            )
            # '*': every entity; else the entities mentioned in that document and no other.
            await conn.execute(
                text(
                    "INSERT INTO community_members (snapshot_id, community_id, entity_id)"
                    " SELECT :s, :c, entity_id FROM mentions GROUP BY entity_id"
                    " HAVING :d = '*' OR bool_and(doc_id = :d)"
                ),
                {"s": snapshot_id, "c": cid, "d": doc},
            )
        # Each entity's communities, as the writer records them next to the memberships.
        await conn.execute(
            text(
                "INSERT INTO snapshot_entities (snapshot_id, entity_id, pagerank, community_ids)"
                " SELECT :s, entity_id, 0, array_agg(community_id ORDER BY community_id)"
                " FROM community_members WHERE snapshot_id = :s GROUP BY entity_id"
            ),
            {"s": snapshot_id},
        )
    return snapshot_id


async def _readable(service: QueryService, caller: Caller) -> set[int]:
    async with read_snapshot(service.engine) as (conn, snapshot_id):
        assert snapshot_id is not None
        return {c.id for c in await list_communities(conn, snapshot_id, None, 10, caller=caller)}


async def test_deleted_restricted_document_keeps_its_communities_hidden(
    deps: IndexerDeps, service: QueryService
) -> None:
    events = [_event(1), _event(2, OVERDRIVE, acl=["hr"])]
    assert await handle_batch(deps, events) == ["applied", "applied"]
    await _publish(service, {1: "*", 2: LELAND})
    anyone, hr = Caller(), Caller(groups=frozenset({"hr"}))
    assert await _readable(service, Caller.operator()) == {1, 2}
    assert await _readable(service, anyone) == {2}, "community 1 includes a document for hr"
    assert await _readable(service, hr) == {1, 2}

    delete = {"event_id": "del-1", "type": "delete", "doc_id": OVERDRIVE}
    delete["occurred_at"] = datetime(2025, 2, 1, tzinfo=UTC).isoformat()
    record = RawRecord("acl", 0, 3, OVERDRIVE.encode(), json.dumps(delete).encode())
    assert await handle_batch(deps, [record]) == ["deleted"]
    # Community 1's summary may quote the deleted document: it is withheld from every caller,
    # the operator too, until a new snapshot is built without it (docs/security.md, "Erasure").
    assert await _readable(service, anyone) == {2}
    assert await _readable(service, hr) == {2}
    assert await _readable(service, Caller.operator()) == {2}
