"""The indexer's error boundary (issue 8): every record ends applied, skipped or dead-lettered
with a reason, transient failures are retried until they pass, and no exception leaves the
handlers. Faults are injected where they happen in production: the OpenAI-compatible endpoint
(a real HTTP server answering 401, dropping connections), PostgreSQL (triggers raising inside
the event's transaction) and the dead-letter path."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError

from services.core.contracts import schema_errors
from services.core.llm.adjudicator import make_adjudicator
from services.core.llm.client import process_client
from services.core.models import build_embedder, build_extractor
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, handle_batch, handle_record
from services.indexer.resolution import ResolverConfig
from tests.conftest import Infra
from tests.support.faults import add_fault_trigger
from tests.support.openai_stub import OpenAIStub
from tests.support.records import dlq_messages, document_event, record, rows

pytestmark = pytest.mark.integration


def stub_settings(stub: OpenAIStub, **extra: Any) -> Settings:
    return Settings(openai_base_url=stub.base_url, llm_timeout_s=5, llm_max_attempts=2, **extra)


def with_stub_embedder(deps: IndexerDeps, stub: OpenAIStub) -> IndexerDeps:
    settings = stub_settings(stub, embedding_backend="openai", embedding_model="stub-embed")
    return replace(deps, embedder=build_embedder(settings, process_client(settings)))


def with_stub_extractor(deps: IndexerDeps, stub: OpenAIStub) -> IndexerDeps:
    settings = stub_settings(stub, extractor_backend="openai")
    return replace(deps, extractor=build_extractor(settings, process_client(settings)))


def with_stub_adjudicator(deps: IndexerDeps, stub: OpenAIStub) -> IndexerDeps:
    settings = stub_settings(stub)
    client = process_client(settings)
    assert client is not None
    adjudicate = make_adjudicator(client, "stub-chat", attempts=2)
    return replace(deps, resolver=ResolverConfig.from_settings(settings, adjudicate))


async def letters(deps: IndexerDeps) -> list[Any]:
    return await rows(
        deps,
        "SELECT reason, detail, doc_id, event_id, key, published_at IS NOT NULL AS published"
        " FROM dead_letters ORDER BY id",
    )


def physicist(n: int, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "event_id": f"ev-{n}",
        "doc_id": f"doc-{n}",
        "title": f"Physicist {n}",
        "text": f"Lise Meitner{n} worked in Berlin with Otto Hahn{n}.",
    }
    return document_event(**{**fields, **extra})


async def test_a_document_that_names_nothing_is_applied(deps: IndexerDeps) -> None:
    """Finding 1: no title and no entities used to raise on an empty mentions insert and stop
    the indexer for good."""
    plain = {
        "event_id": "ne-1",
        "type": "upsert",
        "doc_id": "plain-1",
        "text": "hello world",
        "occurred_at": "2024-01-01T00:00:00Z",
    }
    assert await handle_record(deps, record(plain)) == "applied"
    assert (await rows(deps, "SELECT count(*) FROM chunks WHERE doc_id = 'plain-1'"))[0][0] == 1
    assert (await rows(deps, "SELECT count(*) FROM mentions"))[0][0] == 0
    edited = {
        **plain,
        "event_id": "ne-2",
        "text": "hello again, world",
        "occurred_at": "2024-01-02T00:00:00Z",
    }
    gone = {
        "event_id": "ne-3",
        "type": "delete",
        "doc_id": "plain-1",
        "occurred_at": "2024-01-03T00:00:00Z",
    }
    assert await handle_batch(deps, [record(edited), record(gone)]) == ["applied", "deleted"]


async def test_embedding_endpoint_outage_delays_and_loses_nothing(
    deps: IndexerDeps, openai_stub: OpenAIStub
) -> None:
    stubbed = with_stub_embedder(deps, openai_stub)
    openai_stub.fail_next("disconnect", times=4)  # two calls' worth of attempts
    outcomes = await handle_batch(stubbed, [record(physicist(1)), record(physicist(2))])
    assert outcomes == ["applied", "applied"]
    assert await letters(deps) == []
    assert (await rows(deps, "SELECT count(*) FROM chunks"))[0][0] == 2


async def test_embedding_endpoint_401_dead_letters_the_event(
    deps: IndexerDeps, openai_stub: OpenAIStub, infra: Infra, settings: Settings
) -> None:
    stubbed = with_stub_embedder(deps, openai_stub)
    openai_stub.fail_next("401")
    assert await handle_record(stubbed, record(physicist(1))) == "dead_lettered"
    [(reason, detail, doc_id, event_id, _, published)] = await letters(deps)
    assert (reason, doc_id, event_id, published) == ("processing_failed", "doc-1", "ev-1", True)
    assert detail.startswith("AuthenticationError:")
    # The stream goes on: the next event applies, the failed one is marked as handled.
    assert await handle_record(stubbed, record(physicist(2))) == "applied"
    outcome = await rows(deps, "SELECT outcome FROM processed_events WHERE event_id = 'ev-1'")
    assert outcome[0][0] == "dead_lettered"
    assert len(dlq_messages(infra.bootstrap, settings.dlq_topic)) == 1


async def test_extractor_failures_retry_or_dead_letter(
    deps: IndexerDeps, openai_stub: OpenAIStub
) -> None:
    stubbed = with_stub_extractor(deps, openai_stub)
    openai_stub.fail_next("500", times=2)  # transient: retried until it passes
    assert await handle_record(stubbed, record(physicist(1))) == "applied"
    openai_stub.fail_next("400")  # permanent
    assert await handle_record(stubbed, record(physicist(2))) == "dead_lettered"
    [(reason, detail, doc_id, *_)] = await letters(deps)
    assert (reason, doc_id) == ("extraction_failed", "doc-2")
    assert "rejected the request: 400" in detail


async def test_adjudicator_401_dead_letters_the_event(
    deps: IndexerDeps, openai_stub: OpenAIStub
) -> None:
    einstein = document_event(
        event_id="a1",
        doc_id="doc-a",
        title="Physics",
        text="Albert Einstein was a physicist. Albert Einstein lived in Bern.",
    )
    assert await handle_record(deps, record(einstein)) == "applied"
    stubbed = with_stub_adjudicator(deps, openai_stub)
    openai_stub.fail_next("401")
    alberto = document_event(
        event_id="b1",
        doc_id="doc-b",
        title="Painting",
        text="Alberto Einstein was a painter. Alberto Einstein lived in Milan.",
    )
    assert await handle_record(stubbed, record(alberto)) == "dead_lettered"
    [(reason, detail, doc_id, *_)] = await letters(deps)
    assert (reason, doc_id) == ("processing_failed", "doc-b")
    assert detail.startswith("AuthenticationError:")
    assert len(openai_stub.requests_to("/chat/completions")) == 1


@pytest.fixture
def faulty_chunks(database_url: str) -> None:
    """Inserting a chunk of doc 'poison' raises (permanent); of doc 'flaky', the first two
    tries fail with a serialization failure (transient, SQLSTATE 40001)."""
    add_fault_trigger(
        database_url,
        "fault",
        "BEFORE INSERT ON chunks",
        "IF NEW.doc_id = 'poison' THEN RAISE EXCEPTION 'injected permanent fault'; END IF;"
        " IF NEW.doc_id = 'flaky' AND nextval('fault_seq') <= 2 THEN"
        "  RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';"
        " END IF; RETURN NEW;",
    )


@pytest.mark.usefixtures("faulty_chunks")
async def test_database_errors_mid_transaction(deps: IndexerDeps) -> None:
    batch = [
        record(physicist(1)),
        record(physicist(2, doc_id="poison")),
        record(physicist(3, doc_id="flaky")),
        record(physicist(4)),
    ]
    assert await handle_batch(deps, batch) == ["applied", "dead_lettered", "applied", "applied"]
    [(reason, detail, doc_id, *_)] = await letters(deps)
    assert (reason, doc_id) == ("processing_failed", "poison")
    assert detail.startswith("RaiseException: injected permanent fault")
    docs = {r[0] for r in await rows(deps, "SELECT doc_id FROM documents")}
    assert docs == {"doc-1", "flaky", "doc-4"}  # the poisoned transaction left nothing


@pytest.fixture
def faulty_dead_letters(database_url: str) -> None:
    """The first two dead-letter inserts fail with a serialization failure."""
    add_fault_trigger(
        database_url,
        "dl_fault",
        "BEFORE INSERT ON dead_letters",
        "IF nextval('dl_fault_seq') <= 2 THEN"
        " RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END IF; RETURN NEW;",
    )


@pytest.mark.usefixtures("faulty_dead_letters")
async def test_a_failing_dead_letter_write_is_retried(
    deps: IndexerDeps, infra: Infra, settings: Settings
) -> None:
    failures = [KafkaTimeoutError("injected: broker did not answer")]

    async def flaky_publish(key: bytes | None, value: bytes) -> None:
        if failures:
            raise failures.pop()
        await deps.publish_dead_letter(key, value)

    flaky = replace(deps, publish_dead_letter=flaky_publish)
    assert await handle_record(flaky, record(b"{not json")) == "dead_lettered"
    assert [(r[0], r[5]) for r in await letters(deps)] == [("invalid_json", True)]
    assert len(dlq_messages(infra.bootstrap, settings.dlq_topic)) == 1


async def test_nul_in_ids_and_key_is_dead_lettered_not_fatal(
    deps: IndexerDeps, infra: Infra, settings: Settings
) -> None:
    """Finding 2b: NUL in doc_id/event_id made the dead_letters insert itself raise."""
    poisoned = document_event(event_id="ev\u0000nul", doc_id="nul\u0000doc")
    rec = record(poisoned, key=b"nul\x00doc")
    assert await handle_record(deps, rec) == "dead_lettered"
    [(_, _, doc_id, event_id, key, published)] = await letters(deps)
    assert "\x00" not in f"{doc_id}{event_id}{key}"
    assert published
    assert (await rows(deps, "SELECT raw FROM dead_letters"))[0][0] == rec.value
    assert await handle_record(deps, record(physicist(1))) == "applied"
    assert len(dlq_messages(infra.bootstrap, settings.dlq_topic)) == 1


async def test_an_oversize_record_fits_the_dead_letter_topic(
    deps: IndexerDeps, infra: Infra, settings: Settings
) -> None:
    """Finding 2a: the base64 of a 3 MB record exceeded the producer's 1 MB limit."""
    raw = json.dumps(document_event(text="x" * 3_000_000)).encode()
    assert await handle_record(deps, record(raw)) == "dead_lettered"
    [message] = dlq_messages(infra.bootstrap, settings.dlq_topic)
    assert len(message) < 1_000_000
    letter = json.loads(message)
    assert schema_errors(letter, "dead_letter.v1") == []
    assert letter["reason"] == "oversize"
    assert letter["raw_truncated"] is True
    assert letter["raw_bytes"] == len(raw)
    assert letter["raw_sha256"] == hashlib.sha256(raw).hexdigest()
    assert raw.startswith(base64.b64decode(letter["raw_base64"]))
    assert bytes((await rows(deps, "SELECT raw FROM dead_letters"))[0][0]) == raw


async def test_a_redelivered_dead_letter_is_not_published_twice(
    deps: IndexerDeps, infra: Infra, settings: Settings
) -> None:
    rec = record(b"{not json")
    assert await handle_record(deps, rec) == "dead_lettered"
    assert await handle_record(deps, rec) == "dead_lettered"  # redelivered after a restart
    assert len(await letters(deps)) == 1
    assert len(dlq_messages(infra.bootstrap, settings.dlq_topic)) == 1


async def test_an_acl_change_with_unchanged_content_applies(deps: IndexerDeps) -> None:
    v1 = document_event(version=1, acl=["group:all"], tenant="t1")
    assert await handle_record(deps, record(v1)) == "applied"
    v2 = {**v1, "event_id": "e2", "version": 2, "acl": ["group:hr"]}
    assert await handle_record(deps, record(v2)) == "applied"
    acl = await rows(deps, "SELECT acl, version FROM documents WHERE doc_id = 'doc-curie'")
    assert acl == [(["group:hr"], 2)]
    # An older replay cannot undo it, and an identical upsert changes nothing.
    assert await handle_record(deps, record({**v1, "event_id": "e1-late"})) == "stale"
    assert await handle_record(deps, record({**v2, "event_id": "e2-again"})) == "unchanged"
    changes = await rows(
        deps, "SELECT kind, count(DISTINCT event_id) FROM graph_changes GROUP BY kind ORDER BY 1"
    )
    chunks = await rows(deps, "SELECT count(*) FROM chunks WHERE doc_id = 'doc-curie'")
    access = await rows(deps, "SELECT count(*) FROM graph_changes WHERE event_id = 'e2'")
    # only the first version touched the graph; the second logged its chunks' access change
    # for the query processes' held graphs, and nothing else
    assert dict(changes) == {"access": 1, "edge": 1, "node": 1}
    assert access == chunks


async def test_a_document_over_the_chunk_bound_is_dead_lettered_alone(deps: IndexerDeps) -> None:
    """Finding 4: one huge document held the indexer for minutes; now the work per document is
    bounded, and its neighbours in the batch are not held back."""
    bounded = replace(deps, max_document_chunks=3)
    huge = physicist(1, text=" ".join(f"Sentence {i} names Berlin and Paris." for i in range(300)))
    outcomes = await handle_batch(bounded, [record(huge), record(physicist(2))])
    assert outcomes == ["dead_lettered", "applied"]
    [(reason, detail, doc_id, *_)] = await letters(deps)
    assert (reason, doc_id) == ("oversize", "doc-1")
    assert "the limit is 3" in detail
