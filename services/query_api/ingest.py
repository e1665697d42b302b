"""HTTP ingest: document events validated against the same contract as `kgstream publish`
(schemas/document_event.v1.json, v2) and published to the documents topic keyed by doc_id. All
or nothing: every event is checked (contract and wire size) before any is sent, and one invalid
event means none is published. CloudEvents 1.0 (structured or batch) are converted to native
events first (services/core/cloudevents.py) and published in the native form."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.clocks import bounded_time
from services.core.cloudevents import (
    BATCH,
    DEFAULT_MAPPING,
    STRUCTURED,
    TypeMapping,
    convert,
    media_type,
)
from services.core.contracts import event_problems
from services.core.errors import TransientError
from services.core.producer import discard, make_producer, publish_events
from services.core.settings import Settings


def validate_batch(
    body: Any,
    max_bytes: int,
    max_events: int,
    *,
    content_type: str | None = None,
    types: TypeMapping = DEFAULT_MAPPING,
    received: datetime | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(events, problems): problems are {"index", "errors"} per invalid item (index 0 for a
    single object); events is empty whenever a problem was found. ``content_type``
    application/cloudevents+json (one CloudEvent) or application/cloudevents-batch+json (a list
    of them): each is converted to a native event (services/core/cloudevents.py; ``types``
    decides upsert or delete, ``received`` is the time of one without ``time``) and checked by
    the same contract; anything else: native document events."""
    kind = media_type(content_type)
    cloud = kind in (STRUCTURED, BATCH)
    if cloud and isinstance(body, list) != (kind == BATCH):
        shape = (
            "one CloudEvent (an object)" if kind == STRUCTURED else "a JSON array of CloudEvents"
        )
        reason = f"{kind} carries {shape}; send a list as {BATCH}, one event as {STRUCTURED}"
        return [], [{"index": None, "errors": [reason]}]
    items = body if isinstance(body, list) else [body]
    if not items:
        return [], [{"index": None, "errors": ["no events: send an object or a non-empty list"]}]
    if len(items) > max_events:
        reason = f"{len(items)} events in one request; the limit is {max_events}"
        return [], [{"index": None, "errors": [reason]}]
    at = received or datetime.now(UTC)
    events: list[dict[str, Any]] = []
    problems = []
    for index, item in enumerate(items):
        if cloud:
            event, errors = convert(item, types, at, max_bytes)
        else:
            event, errors = item, event_problems(item, max_bytes)
        if errors or event is None:
            event_id = _event_id(item, "id" if cloud else "event_id")
            problems.append({"index": index, "event_id": event_id, "errors": errors})
        else:
            events.append(event)
    return ([] if problems else events), problems


def tenant_bound(caller: Caller) -> bool:
    """Writes of a non-admin API key stay in the key's tenant (none for a tenantless key).
    Anonymous callers (keys not required, loopback) and admin keys write anywhere."""
    return caller.key_id is not None and not caller.admin


NOT_HELD = "no document with this id in this key's tenant"


@dataclass(frozen=True)
class StoredDocument:
    """What ingest needs of a documents row (a deleted document keeps its row, a tombstone)."""

    tenant: str | None
    version: int | None
    occurred_at: datetime
    deleted: bool


def writable_by(row: StoredDocument | None, tenant: str | None) -> bool:
    """May a key of ``tenant`` upsert or delete this id? An id nobody stored (its delete
    leaves a tombstone with the tenant), one stored under ``tenant`` (live or deleted: a
    tombstone keeps its tenant, so a tenant may create a document it deleted again), and a
    tombstone without a tenant (left by deletes before tombstones kept one) are; an id
    stored under another tenant, or live without one, is not."""
    if row is None or row.tenant == tenant:
        return True
    return row.deleted and row.tenant is None


def bind_tenant(
    events: list[dict[str, Any]], tenant: str | None, rows: Mapping[str, StoredDocument]
) -> list[dict[str, Any]]:
    """Give events without a tenant the key's; return a problem per event that names another
    tenant or writes a doc_id the tenant may not write (``writable_by``; ``rows``: the stored
    documents among the events' ids). A refused delete is told ``NOT_HELD``, the answer
    DELETE /v1/documents gives, which does not say whether the id exists."""
    problems = []
    for index, event in enumerate(events):
        if "tenant" not in event and tenant:
            event["tenant"] = tenant
        errors = []
        if "tenant" in event and event.get("tenant") != tenant:
            errors.append("this API key may only write documents of its own tenant")
        if not writable_by(rows.get(str(event["doc_id"])), tenant):
            deleting = event.get("type") == "delete"
            errors.append(NOT_HELD if deleting else "the document belongs to another tenant")
        if errors:
            problems.append({"index": index, "event_id": _event_id(event), "errors": errors})
    return problems


async def stored_documents(
    conn: AsyncConnection, doc_ids: Sequence[str]
) -> dict[str, StoredDocument]:
    """The stored rows (live or deleted) of ``doc_ids``, by id."""
    rows = await conn.execute(
        text(
            "SELECT doc_id, tenant, version, occurred_at, deleted FROM documents"
            " WHERE doc_id = ANY(:ids)"
        ),
        {"ids": list(doc_ids)},
    )
    return {
        str(r.doc_id): StoredDocument(r.tenant, r.version, r.occurred_at, r.deleted)
        for r in rows.all()
    }


def delete_event(
    doc_id: str,
    *,
    stored: StoredDocument | None = None,
    tenant: str | None = None,
    max_skew_s: float = 300.0,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A delete event for ``doc_id`` with a fresh event id: "the document is gone as of now".
    It carries no version, so the indexer applies it to whatever is stored when it arrives
    (services/indexer/ordering.py ``decide_delete``): every upsert published before it,
    a higher version still in the topic included. Its time is the later of now and the
    stored time (bounded by the clock rule, services/core/clocks.py), and the tombstone
    blocks what is not newer, so only what is published after it re-creates the document.
    ``tenant``: the deleting key's, kept by the tombstone of an id nobody stored."""
    at = now or datetime.now(UTC)
    if stored is not None:
        at = max(at, bounded_time(stored.occurred_at, at, timedelta(seconds=max_skew_s)))
    event: dict[str, Any] = {
        "event_id": f"api-delete-{uuid.uuid4()}",
        "type": "delete",
        "doc_id": doc_id,
        "occurred_at": at.isoformat(),
    }
    if tenant:
        event["tenant"] = tenant
    return event


def _event_id(item: Any, field: str = "event_id") -> Any:
    event_id = item.get(field) if isinstance(item, dict) else None
    return event_id if isinstance(event_id, str | int) else None


class DocumentPublisher:
    """One kafka-python producer per process, connected on first use (the API serves queries
    even while the broker is down). ``send`` blocks: call it from a worker thread. A broker
    that does not answer within ``ingest_publish_timeout_s`` raises TransientError, and the
    producer is dropped: the next send makes a new one, so a broker that restarted (and forgot
    this producer, its connections and metadata) is used again without restarting the API.
    ``state`` says whether the last send went through, for /readyz."""

    def __init__(self, bootstrap: str, topic: str, settings: Settings) -> None:
        self.bootstrap, self.topic, self.settings = bootstrap, topic, settings
        self.timeout_s = settings.ingest_publish_timeout_s
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()
        self._last_error: str | None = None

    @property
    def state(self) -> dict[str, Any]:
        """``{"ingest": "ok"}``, or ``"unavailable"`` with the last send's error until a send
        goes through again."""
        if self._last_error is None:
            return {"ingest": "ok"}
        return {"ingest": "unavailable", "ingest_detail": self._last_error}

    def send(self, events: Sequence[dict[str, Any]]) -> int:
        """Publish keyed by doc_id and wait for the broker's acknowledgements."""
        producer: KafkaProducer | None = None
        try:
            with self._lock:
                if self._producer is None:
                    self._producer = make_producer(
                        self.bootstrap, self.settings, timeout_s=self.timeout_s
                    )
                producer = self._producer
            sent = publish_events(producer, self.topic, events, self.timeout_s)
        except KafkaError as exc:
            self._drop(producer)
            self._last_error = f"{type(exc).__name__}: {exc}"[:300]
            # Some events may still be delivered later: a retry with the same event ids is safe.
            raise TransientError(f"the broker did not accept the events: {exc}") from exc
        self._last_error = None
        return sent

    def _drop(self, failed: KafkaProducer | None) -> None:
        """Forget ``failed`` (unless another thread replaced it already) and close it in the
        background: what it still holds was answered 503."""
        with self._lock:
            if failed is None or self._producer is not failed:
                return
            self._producer = None
        discard(failed, self.timeout_s)

    def close(self) -> None:
        """Flush and close the producer if one was made."""
        with self._lock:
            if self._producer is not None:
                # A broker that is gone must not turn shutdown into a traceback: what was not
                # acknowledged was answered 503 already.
                with contextlib.suppress(KafkaError):
                    self._producer.close(timeout=self.timeout_s)
                self._producer = None
