"""CloudEvents 1.0 in (issue 22), with real parts: over HTTP (structured and batch mode) through
the whole API app to the real broker, and as Kafka records produced by librdkafka
(confluent-kafka) in the binding's binary mode (``ce_*`` headers) and in structured mode, read by
a real indexer worker into the real database. A bad CloudEvent is a 422 with nothing published,
or a dead letter that keeps the record's headers, which `kgstream dlq replay` sends again."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, Message, Producer

from services.core.api_keys import create_key
from services.core.cloudevents import parse_type_mapping
from services.core.contracts import schema_errors
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, RawRecord, handle_record
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.conftest import Infra
from tests.support.cli import kgstream
from tests.support.graph import scalar
from tests.support.records import records_on
from tests.support.workers import (
    Published,
    assert_all_committed,
    sample_lines,
    start_worker,
    stop_workers,
)

pytestmark = pytest.mark.integration
STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
SOURCE = "https://dms.example.com/repositories/legal"


def cloudevent(
    n: int, ce_type: str = "com.example.dms.document.created", **extra: Any
) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": f"ce-{n}",
        "source": SOURCE,
        "type": ce_type,
        "subject": f"ce-doc-{n}",
        "time": "2026-11-27T04:00:00Z",
        "datacontenttype": "application/json",
        "dmsuser": "alice",
        "data": {
            "title": f"Contract {n}",
            "text": f"Marie Curie signed contract {n} in Paris.",
            "metadata": {"folder": "/legal"},
            "version": n,
        },
        **extra,
    }


# --- HTTP ------------------------------------------------------------------------------------


IngestFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def make_ingest(
    settings: Settings,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> IngestFactory:
    """``async with make_ingest(**settings) as client``: the whole API app (middlewares
    included) on this test's database and topics."""

    @asynccontextmanager
    async def make(**overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
        configured = settings.model_copy(update=overrides)
        url = str(settings.database_url)
        engine = make_engine(url)
        service = build_query_service(configured, engine, embedder, extractor, cpu_pool)
        app = create_app(configured, Endpoints(url, infra.bootstrap), service=service)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                yield client
        finally:
            app.state.publisher.close()
            await engine.dispose()

    return make


@pytest.fixture
async def ingest(make_ingest: IngestFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with make_ingest() as client:
        yield client


def topic_records(settings: Settings, topic: str | None = None) -> list[Any]:
    """Every record on ``topic`` (default: the documents topic), all partitions."""
    return records_on(str(settings.kafka_bootstrap_servers), topic or settings.documents_topic)


def post(client: httpx.AsyncClient, body: Any, content_type: str, key: str = "") -> Any:
    headers = {"content-type": content_type}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return client.post("/v1/documents", content=json.dumps(body), headers=headers)


async def test_cloudevents_over_http_are_published_as_document_events(
    ingest: httpx.AsyncClient, settings: Settings
) -> None:
    one = await post(ingest, cloudevent(1), f"{STRUCTURED}; charset=utf-8")
    assert one.status_code == 202, one.text
    assert one.json()["event_ids"] == ["ce-1"]
    delete = {k: v for k, v in cloudevent(2).items() if k not in ("data", "time")}
    batch = [cloudevent(3), {**delete, "type": "com.example.dms.document.deleted"}]
    two = await post(ingest, batch, BATCH)
    assert two.status_code == 202, two.text
    assert two.json()["event_ids"] == ["ce-3", "ce-2"]

    records = topic_records(settings)
    values = {json.loads(r.value)["event_id"]: json.loads(r.value) for r in records}
    assert set(values) == {"ce-1", "ce-2", "ce-3"}
    assert {r.key for r in records} == {b"ce-doc-1", b"ce-doc-2", b"ce-doc-3"}
    assert values["ce-1"] == {
        "event_id": "ce-1",
        "type": "upsert",
        "doc_id": "ce-doc-1",
        "occurred_at": "2026-11-27T04:00:00Z",
        "title": "Contract 1",
        "text": "Marie Curie signed contract 1 in Paris.",
        "version": 1,
        "metadata": {
            "folder": "/legal",
            "cloudevent": {
                "source": SOURCE,
                "type": "com.example.dms.document.created",
                "dmsuser": "alice",
            },
        },
    }
    assert values["ce-2"]["type"] == "delete"
    assert values["ce-2"]["occurred_at"].endswith("+00:00")  # received now: no time given
    assert schema_errors(values["ce-2"]) == []


async def test_a_bad_cloudevent_over_http_is_422_and_nothing_is_published(
    ingest: httpx.AsyncClient, settings: Settings
) -> None:
    bad = [
        cloudevent(4),
        cloudevent(5, ce_type="com.example.dms.document.renamed"),
        {**cloudevent(6), "specversion": "0.3", "subject": ""},
        {**cloudevent(7), "data_base64": "aGVsbG8="},
    ]
    answer = await post(ingest, bad, BATCH)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert problem["detail"] == "3 invalid event(s); nothing was published"
    assert [(e["index"], e["event_id"]) for e in problem["errors"]] == [
        (1, "ce-5"),
        (2, "ce-6"),
        (3, "ce-7"),
    ]
    assert (
        "'com.example.dms.document.renamed' maps to neither upsert nor delete"
        in (problem["errors"][0]["errors"][0])
    )
    assert [e.split(":")[0] for e in problem["errors"][1]["errors"]] == [
        "$.specversion",
        "$.subject",
    ]
    assert "binary data is not supported" in problem["errors"][2]["errors"][0]
    wrong_shape = await post(ingest, [cloudevent(8)], STRUCTURED)  # a list in structured mode
    assert wrong_shape.status_code == 422
    assert BATCH in wrong_shape.json()["errors"][0]["errors"][0]
    no_text = await post(ingest, {**cloudevent(9), "data": {"title": "T"}}, STRUCTURED)
    assert no_text.json()["errors"][0]["errors"] == ["$.data: 'text' is a required property"]
    # The native contract stays the default: a CloudEvent as application/json is not one.
    native = await ingest.post("/v1/documents", json=cloudevent(10))
    assert native.status_code == 422
    assert "Additional properties are not allowed" in native.text
    assert topic_records(settings) == []


async def test_cloudevents_over_http_keep_scopes_and_tenant_binding(
    make_ingest: IngestFactory, settings: Settings
) -> None:
    """The same rules as native events: an ingest key bound to a tenant gives its tenant to
    events without one and may not write another's (403, nothing published); a query key may
    not ingest at all."""
    async with make_ingest(auth="required", auth_cache_ttl_s=0) as client:
        engine = make_engine(str(settings.database_url))
        acme = (await create_key(engine, ["ingest"], tenant="acme"))[1]
        reader = (await create_key(engine, ["query"]))[1]
        await engine.dispose()
        assert (await post(client, cloudevent(1), STRUCTURED)).status_code == 401
        assert (await post(client, cloudevent(1), STRUCTURED, reader)).status_code == 403
        theirs = {**cloudevent(2), "data": {"text": "t", "tenant": "other"}}
        refused = await post(client, [cloudevent(3), theirs], BATCH, acme)
        assert refused.status_code == 403, refused.text
        assert refused.json()["errors"][0]["event_id"] == "ce-2"
        accepted = await post(client, cloudevent(4), STRUCTURED, acme)
        assert accepted.status_code == 202, accepted.text
    (record,) = topic_records(settings)
    assert json.loads(record.value)["tenant"] == "acme"


# --- Kafka -----------------------------------------------------------------------------------


def ce_headers(event: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The binary-mode headers of a CloudEvent (every attribute but data)."""
    headers = [
        ("content-type" if k == "datacontenttype" else f"ce_{k}", str(v).encode())
        for k, v in event.items()
        if k != "data"
    ]
    return [*headers, ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]


def produce(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]
) -> list[Published]:
    """Send (key, value, headers) records to partition 0 with librdkafka, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    reports: list[tuple[KafkaError | None, Message]] = []
    for key, value, headers in records:
        producer.produce(
            topic,
            key=key,
            value=value,
            headers=[(name, header) for name, header in headers],
            partition=0,
            on_delivery=lambda err, msg: reports.append((err, msg)),
        )
    assert producer.flush(60) == 0, "librdkafka did not deliver everything within 60 s"
    assert all(err is None for err, _ in reports), reports
    return [Published((m.key() or b"").decode(), 0, m.offset() or 0) for _, m in reports]


async def test_kafka_binary_and_structured_cloudevents_are_indexed_and_bad_ones_keep_headers(
    settings: Settings, deps: IndexerDeps, tmp_path: Path
) -> None:
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    binary, gone, renamed = cloudevent(1), cloudevent(3), cloudevent(4, "com.example.doc.renamed")
    structured = cloudevent(2)
    delete = {k: v for k, v in gone.items() if k not in ("data", "time", "datacontenttype")}
    delete = {**delete, "id": "ce-3-deleted", "type": "com.example.dms.document.deleted"}
    native = sample_lines()[0].encode()
    records = [
        (b"ce-doc-1", json.dumps(binary["data"]).encode(), ce_headers(binary)),
        (b"ce-doc-2", json.dumps(structured).encode(), [("content-type", STRUCTURED.encode())]),
        (b"ce-doc-3", json.dumps(gone["data"]).encode(), ce_headers(gone)),
        (b"ce-doc-3", None, ce_headers(delete)),
        (b"ce-doc-4", json.dumps(renamed["data"]).encode(), ce_headers(renamed)),
        (
            str(json.loads(native)["doc_id"]).encode(),
            native,
            [("content-type", b"application/json")],
        ),  # native: no ce_ headers
    ]
    worker = start_worker(settings, tmp_path / "indexer.log")
    try:
        assert_all_committed(
            worker, settings, produce(bootstrap, settings.documents_topic, records)
        )
    finally:
        stop_workers([worker])

    rows = scalar(
        url,
        "SELECT json_object_agg(doc_id, json_build_array(deleted, title, version, tenant,"
        " metadata)) FROM documents",
    )
    assert set(rows) == {"ce-doc-1", "ce-doc-2", "ce-doc-3", json.loads(native)["doc_id"]}
    deleted, title, version, _, metadata = rows["ce-doc-1"]
    assert (deleted, title, version) == (False, "Contract 1", 1)
    assert metadata == {
        "folder": "/legal",
        "cloudevent": {
            "source": SOURCE,
            "type": "com.example.dms.document.created",
            "dmsuser": "alice",
        },  # traceparent is no ce_ header: not an attribute (the dead letter keeps it, below)
    }
    assert rows["ce-doc-2"][1] == "Contract 2"
    assert rows["ce-doc-3"][0] is True  # created, then deleted in binary mode without a value
    outcomes = scalar(url, "SELECT json_object_agg(event_id, outcome) FROM processed_events")
    assert outcomes["ce-1"] == outcomes["ce-2"] == outcomes["ce-3"] == "applied"
    assert outcomes["ce-3-deleted"] == "deleted"

    # The bad one: dead-lettered with its value and its headers, in the table and on the topic.
    (letter,) = scalar(url, "SELECT json_agg(json_build_object('reason', reason, 'detail',"
                            " detail, 'headers', headers, 'raw', encode(raw, 'base64')))"
                            " FROM dead_letters")  # fmt: skip
    assert letter["reason"] == "contract_violation"
    assert "$.type: 'com.example.doc.renamed' maps to neither upsert nor delete" in letter["detail"]
    sent = [(h[0], h[1]) for h in ce_headers(renamed)]
    kept = [(h["key"], base64.b64decode(h["value_base64"])) for h in letter["headers"]]
    assert kept == sent
    assert base64.b64decode(letter["raw"]) == json.dumps(renamed["data"]).encode()
    (dlq,) = topic_records(settings, settings.dlq_topic)
    payload = json.loads(dlq.value)
    assert schema_errors(payload, "dead_letter.v1") == []
    assert payload["source"]["headers"] == letter["headers"]

    listed = kgstream(settings, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (shown,) = json.loads(listed.stdout)
    assert shown["headers"] == [[k, v.decode()] for k, v in sent]

    # `kgstream dlq replay` sends the value with its headers; once the mapping knows the type,
    # the replayed record is indexed.
    replayed = kgstream(settings, "dlq", "replay")
    assert replayed.returncode == 0, replayed.stderr
    again = topic_records(settings)[-1]
    assert (again.key, again.value) == (b"ce-doc-4", json.dumps(renamed["data"]).encode())
    assert [(k, bytes(v)) for k, v in again.headers] == sent
    knows = replace(deps, cloudevent_types=parse_type_mapping(".renamed=upsert"))
    record = RawRecord(
        again.topic, again.partition, again.offset, again.key, again.value,
        timestamp=again.timestamp / 1000, headers=tuple(again.headers),
    )  # fmt: skip
    assert await handle_record(knows, record) == "applied"
    assert scalar(url, "SELECT title FROM documents WHERE doc_id = 'ce-doc-4'") == "Contract 4"
