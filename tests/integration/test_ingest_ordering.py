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
from services.query_api.service import build_query_service
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


async def test_a_tenant_cannot_delete_ids_it_does_not_hold(api: Api) -> None:
    """Failed on 4163b39: t1's DELETE of an id nobody stored was accepted and left a tombstone
    without a tenant, so t2 could never create that id (403). Now a key deletes only documents
    of its tenant, and the answer for another tenant's id is the one for an unknown id."""
    unknown = await api.delete("t1", "nobody")
    assert unknown.status_code == 404, unknown.text
    assert unknown.headers["content-type"].startswith("application/problem+json")
    await api.relay.nothing_more()
    assert await api.row("nobody") is None
    created = await api.post("t2", upsert("nobody", "Vienna is in Austria.", now()))
    assert created.status_code == 202, created.text
    assert await api.relay.apply(1) == ["applied"]
    assert (await api.row("nobody")).tenant == "t2"
    foreign = await api.delete("t1", "nobody")
    assert (foreign.status_code, foreign.json()["detail"]) == (404, unknown.json()["detail"])
    # A delete event posted in a batch is held to the same rule (all or none).
    batch = [
        upsert("t1-doc", "Graz is in Austria.", now()),
        {"event_id": "del-1", "type": "delete", "doc_id": "nobody-else",
         "occurred_at": "2026-01-01T00:00:00Z"},
    ]  # fmt: skip
    refused = await api.post("t1", batch)
    assert refused.status_code == 403, refused.text
    assert [e["index"] for e in refused.json()["errors"]] == [1]
    await api.relay.nothing_more()
    assert (await api.row("nobody")).deleted is False
