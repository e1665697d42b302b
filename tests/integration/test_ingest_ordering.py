"""Issue 18, findings 5 and 6, through the real HTTP ingest, broker and indexer handler: every
event the API publishes is read back from the topic and handed to ``handle_record`` with its
record's timestamp, as the indexer's agent does.

5: an upsert with ``occurred_at`` in 2099 froze the document: a later update without a version
was stale, and ``DELETE /v1/documents/ID`` answered 202 and was stale too.
6: an HTTP DELETE dropped the tenant: a key could not re-create its own deleted document, and a
key could DELETE an id nobody had stored, after which no other tenant could ever create it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import text

from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, Outcome, RawRecord, handle_record
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.conftest import Infra

pytestmark = pytest.mark.integration


class Relay:
    """Reads what the API published to the documents topic and applies it with the indexer's
    handler, record by record in offset order (one partition per doc_id, as the agent sees)."""

    def __init__(self, bootstrap: str, topic: str, deps: IndexerDeps) -> None:
        self.deps = deps
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        parts = [
            TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic))
        ]
        self.consumer.assign(parts)
        self.consumer.seek_to_beginning(*parts)

    def _poll(self, expected: int, timeout: float) -> list[Any]:
        found: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(found) < expected and time.monotonic() < deadline:
            for batch in self.consumer.poll(timeout_ms=200).values():
                found.extend(batch)
        return found

    async def apply(self, expected: int) -> list[Outcome]:
        """Wait for ``expected`` new records and apply them; fail on more or fewer."""
        found = await asyncio.to_thread(self._poll, expected, 20.0)
        assert len(found) == expected, [json.loads(m.value) for m in found]
        return [
            await handle_record(
                self.deps,
                RawRecord(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp / 1000),
            )
            for m in found
        ]

    async def nothing_more(self) -> None:
        assert await asyncio.to_thread(self._poll, 1, 1.0) == []


@dataclass(frozen=True)
class Api:
    client: httpx.AsyncClient
    relay: Relay
    keys: dict[str, dict[str, str]]  # name -> Authorization header

    async def post(self, who: str, body: Any) -> httpx.Response:
        resp: httpx.Response = await self.client.post(
            "/v1/documents", json=body, headers=self.keys[who]
        )
        return resp

    async def delete(self, who: str, doc_id: str) -> httpx.Response:
        resp: httpx.Response = await self.client.delete(
            f"/v1/documents/{doc_id}", headers=self.keys[who]
        )
        return resp

    async def row(self, doc_id: str) -> Any:
        async with self.relay.deps.engine.connect() as conn:
            found = await conn.execute(
                text(
                    "SELECT d.tenant, d.deleted, d.occurred_at,"
                    " (SELECT count(*) FROM chunks c WHERE c.doc_id = d.doc_id) AS chunks"
                    " FROM documents d WHERE d.doc_id = :d"
                ),
                {"d": doc_id},
            )
            return found.one_or_none()


@pytest.fixture
async def api(
    *,
    settings: Settings,
    deps: IndexerDeps,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[Api]:
    """The query API with keys required over the test's database and topic, keys of two
    tenants, a tenantless ingest key and an admin key, and a relay into the indexer."""
    assert settings.database_url is not None
    app_settings = settings.model_copy(update={"auth": "required", "auth_cache_ttl_s": 0})
    engine = make_engine(settings.database_url)
    service = build_query_service(app_settings, engine, embedder, extractor, cpu_pool)
    app = create_app(
        app_settings, Endpoints(settings.database_url, infra.bootstrap), service=service
    )
    keys = {
        "t1": (await create_key(engine, ["ingest"], tenant="t1"))[1],
        "t2": (await create_key(engine, ["ingest"], tenant="t2"))[1],
        "plain": (await create_key(engine, ["ingest"]))[1],
        "admin": (await create_key(engine, ["admin"]))[1],
    }
    relay = Relay(infra.bootstrap, settings.documents_topic, deps)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api"
        ) as client:
            yield Api(client, relay, {k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()})
    finally:
        relay.consumer.close()
        await asyncio.to_thread(app.state.publisher.close)
        await engine.dispose()


_serial = iter(range(1_000_000))


def upsert(doc_id: str, text_: str, at: datetime | str, **extra: Any) -> dict[str, Any]:
    when = at if isinstance(at, str) else at.isoformat()
    return {
        "event_id": f"{doc_id}-{next(_serial)}",
        "type": "upsert",
        "doc_id": doc_id,
        "text": text_,
        "occurred_at": when,
        **extra,
    }


def now() -> datetime:
    return datetime.now(UTC)


async def test_a_clock_far_ahead_neither_freezes_nor_undeletes(api: Api) -> None:
    """Failed on 4163b39: the update after the 2099 upsert was stale, and so was the delete."""
    first = await api.post("plain", upsert("clock", "Paris is in France.", "2099-01-01T00:00:00Z"))
    assert first.status_code == 202, first.text
    assert await api.relay.apply(1) == ["applied"]
    update = await api.post("plain", upsert("clock", "Lyon is in France.", now()))
    assert update.status_code == 202
    assert await api.relay.apply(1) == ["applied"]
    assert (await api.delete("plain", "clock")).status_code == 202
    assert await api.relay.apply(1) == ["deleted"]
    row = await api.row("clock")
    assert (row.deleted, row.chunks) == (True, 0)


async def test_a_row_frozen_before_the_fix_can_still_be_deleted(api: Api) -> None:
    """A documents row already holding a far-future occurred_at (written before the bound):
    failed on 4163b39 (the delete was stale)."""
    assert (await api.post("admin", upsert("legacy", "Rome is in Italy.", now()))).is_success
    assert await api.relay.apply(1) == ["applied"]
    async with api.relay.deps.engine.begin() as conn:
        await conn.execute(
            text("UPDATE documents SET occurred_at = '9999-12-31T00:00:00Z' WHERE doc_id = :d"),
            {"d": "legacy"},
        )
    assert (await api.delete("admin", "legacy")).status_code == 202
    assert await api.relay.apply(1) == ["deleted"]
    assert (await api.row("legacy")).deleted


async def test_an_http_delete_gets_through_a_clock_slightly_ahead(api: Api) -> None:
    """An occurred_at within the allowed skew is trusted, yet an HTTP DELETE sent right after
    still applies: it deletes the document as stored. Failed on 4163b39 (stale)."""
    ahead = now() + timedelta(seconds=120)
    assert (await api.post("t1", upsert("ahead", "Oslo is in Norway.", ahead))).is_success
    assert await api.relay.apply(1) == ["applied"]
    assert (await api.row("ahead")).occurred_at == ahead  # within the skew: trusted
    assert (await api.delete("t1", "ahead")).status_code == 202
    assert await api.relay.apply(1) == ["deleted"]


async def test_a_tenant_deletes_and_re_creates_its_own_document(api: Api) -> None:
    """Failed on 4163b39: the tombstone lost the tenant, so the re-create was refused (403)."""
    assert (await api.post("t1", upsert("mine", "Bern is in Switzerland.", now()))).is_success
    assert await api.relay.apply(1) == ["applied"]
    assert (await api.delete("t1", "mine")).status_code == 202
    assert await api.relay.apply(1) == ["deleted"]
    tombstone = await api.row("mine")
    assert (tombstone.tenant, tombstone.deleted) == ("t1", True)
    again = await api.post("t1", upsert("mine", "Basel is in Switzerland.", now()))
    assert again.status_code == 202, again.text
    assert await api.relay.apply(1) == ["applied"]
    assert (await api.row("mine")).tenant == "t1"
    # An admin's delete keeps the document's tenant on the tombstone too.
    assert (await api.delete("admin", "mine")).status_code == 202
    assert await api.relay.apply(1) == ["deleted"]
    assert (await api.row("mine")).tenant == "t1"
    assert (await api.post("t1", upsert("mine", "Zug is in Switzerland.", now()))).is_success
    assert await api.relay.apply(1) == ["applied"]


async def test_a_tenant_deletes_ids_nobody_stored_but_never_another_tenants(api: Api) -> None:
    """A key may delete an id nobody stored: the tombstone keeps its tenant (it used to be
    NULL, blocking every tenant). An id stored under another tenant, or live without one, is
    refused with 404, the same answer whether or not it exists."""
    fresh = await api.delete("t1", "nobody")
    assert fresh.status_code == 202, fresh.text
    assert await api.relay.apply(1) == ["deleted"]
    assert tuple(await api.row("nobody"))[:2] == ("t1", True)
    assert (
        await api.post("t2", upsert("nobody", "Vienna is in Austria.", now()))
    ).status_code == 403
    assert (await api.post("t1", upsert("nobody", "Vienna is in Austria.", now()))).is_success
    assert await api.relay.apply(1) == ["applied"]
    foreign = await api.delete("t2", "nobody")
    assert (await api.post("admin", upsert("shared", "Linz is in Austria.", now()))).is_success
    assert await api.relay.apply(1) == ["applied"]
    tenantless = await api.delete("t1", "shared")
    assert (foreign.status_code, tenantless.status_code) == (404, 404)
    assert foreign.json()["detail"] == tenantless.json()["detail"]
    # A delete event posted in a batch is held to the same rule (all or none).
    batch = [
        upsert("t1-doc", "Graz is in Austria.", now()),
        {"event_id": "del-1", "type": "delete", "doc_id": "shared",
         "occurred_at": "2026-01-01T00:00:00Z"},
    ]  # fmt: skip
    batch_refused = await api.post("t1", batch)
    assert batch_refused.status_code == 403, batch_refused.text
    assert [e["index"] for e in batch_refused.json()["errors"]] == [1]
    await api.relay.nothing_more()
    assert (await api.row("shared")).deleted is False


async def test_an_http_delete_wins_over_what_was_published_before_it(api: Api) -> None:
    """Failed on the first fix: the DELETE copied the stored version (1), so an update v2
    published before it but not yet applied (indexer lag) made it stale, 202 and the document
    stayed. Now it applies, and its tombstone keeps v2: only a later version re-creates."""
    assert (
        await api.post("admin", upsert("lag", "Turin is in Italy.", now(), version=1))
    ).is_success
    assert await api.relay.apply(1) == ["applied"]
    ahead = now() + timedelta(seconds=120)  # a publisher's clock ahead within the skew
    v2 = upsert("lag", "Milan is in Italy.", ahead, version=2)
    assert (await api.post("admin", v2)).is_success
    assert (await api.delete("admin", "lag")).status_code == 202  # reads v1: v2 not applied
    assert await api.relay.apply(2) == ["applied", "deleted"]
    row = await api.row("lag")
    assert (row.deleted, row.chunks) == (True, 0)
    replay = {**v2, "event_id": "lag-v2-again"}  # v2 sent again after the delete
    assert (await api.post("admin", replay)).is_success
    assert await api.relay.apply(1) == ["stale"]
    assert (
        await api.post("admin", upsert("lag", "Genoa is in Italy.", now(), version=3))
    ).is_success
    assert await api.relay.apply(1) == ["applied"]


async def test_a_tenant_deletes_its_document_before_the_indexer_stored_it(api: Api) -> None:
    """Failed on the first fix: t1's DELETE of a document it had published but the indexer
    had not stored yet was refused (404)."""
    ahead = now() + timedelta(seconds=120)
    assert (await api.post("t1", upsert("early", "Naples is in Italy.", ahead))).is_success
    deleted = await api.delete("t1", "early")
    assert deleted.status_code == 202, deleted.text
    assert await api.relay.apply(2) == ["applied", "deleted"]
    assert tuple(await api.row("early"))[:2] == ("t1", True)


async def test_a_tenant_claims_a_tombstone_left_without_a_tenant(api: Api) -> None:
    """Tombstones written by deletes before tombstones kept a tenant have tenant NULL: failed
    on the first fix (403 for the re-create, 404 for a delete)."""
    assert (await api.post("admin", upsert("old", "Pisa is in Italy.", now()))).is_success
    assert await api.relay.apply(1) == ["applied"]
    async with api.relay.deps.engine.begin() as conn:
        await conn.execute(
            text("UPDATE documents SET tenant = NULL, deleted = true WHERE doc_id = 'old'")
        )
    assert (await api.delete("t1", "old")).status_code == 202
    assert await api.relay.apply(1) == ["unchanged"]
    claimed = await api.post("t1", upsert("old", "Siena is in Italy.", now()))
    assert claimed.status_code == 202, claimed.text
    assert await api.relay.apply(1) == ["applied"]
    assert tuple(await api.row("old"))[:2] == ("t1", False)
    assert (await api.post("t2", upsert("old", "Lucca is in Italy.", now()))).status_code == 403
