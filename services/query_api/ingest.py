"""HTTP ingest: document events validated against the same contract as `kgstream publish`
(schemas/document_event.v1.json) and published to the documents topic keyed by doc_id. All or
nothing: every event is checked (contract and wire size) before any is sent, and one invalid
event means none is published."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.contracts import event_problems
from services.core.errors import TransientError
from services.core.producer import make_producer, publish_events
from services.core.settings import Settings


def validate_batch(
    body: Any, max_bytes: int, max_events: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(events, problems): problems are {"index", "errors"} per invalid item (index 0 for a
    single object); events is empty whenever a problem was found."""
    items = body if isinstance(body, list) else [body]
    if not items:
        return [], [{"index": None, "errors": ["no events: send an object or a non-empty list"]}]
    if len(items) > max_events:
        reason = f"{len(items)} events in one request; the limit is {max_events}"
        return [], [{"index": None, "errors": [reason]}]
    problems = []
    for index, item in enumerate(items):
        errors = event_problems(item, max_bytes)
        if errors:
            problems.append({"index": index, "event_id": _event_id(item), "errors": errors})
    return ([] if problems else list(items)), problems


def tenant_bound(caller: Caller) -> bool:
    """Writes of a non-admin API key stay in the key's tenant (none for a tenantless key).
    Anonymous callers (keys not required, loopback) and admin keys write anywhere."""
    return caller.key_id is not None and not caller.admin


def bind_tenant(
    events: list[dict[str, Any]], tenant: str | None, foreign: set[str]
) -> list[dict[str, Any]]:
    """Give events without a tenant the key's; return a problem per event that names another
    tenant or a doc_id stored under another tenant (``foreign``)."""
    problems = []
    for index, event in enumerate(events):
        if event.get("type", "upsert") == "upsert" and "tenant" not in event and tenant:
            event["tenant"] = tenant
        errors = []
        if "tenant" in event and event.get("tenant") != tenant:
            errors.append("this API key may only write documents of its own tenant")
        if str(event["doc_id"]) in foreign:
            errors.append("the document belongs to another tenant")
        if errors:
            problems.append({"index": index, "event_id": _event_id(event), "errors": errors})
    return problems


async def foreign_documents(
    conn: AsyncConnection, doc_ids: Sequence[str], tenant: str | None
) -> set[str]:
    """Which of ``doc_ids`` are stored (deleted or not) under another tenant."""
    rows = await conn.execute(
        text(
            "SELECT doc_id FROM documents WHERE doc_id = ANY(:ids) AND tenant IS DISTINCT FROM :t"
        ),
        {"ids": list(doc_ids), "t": tenant},
    )
    return {str(r[0]) for r in rows.all()}


def delete_event(doc_id: str) -> dict[str, Any]:
    """A delete event for ``doc_id`` with a fresh event id, happening now."""
    return {
        "event_id": f"api-delete-{uuid.uuid4()}",
        "type": "delete",
        "doc_id": doc_id,
        "occurred_at": datetime.now(UTC).isoformat(),
    }


def _event_id(item: Any) -> Any:
    event_id = item.get("event_id") if isinstance(item, dict) else None
    return event_id if isinstance(event_id, str | int) else None


class DocumentPublisher:
    """One kafka-python producer per process, connected on first use (the API serves queries
    even while the broker is down). ``send`` blocks: call it from a worker thread. A broker
    that does not answer within ``ingest_publish_timeout_s`` raises TransientError."""

    def __init__(self, bootstrap: str, topic: str, settings: Settings) -> None:
        self.bootstrap, self.topic, self.settings = bootstrap, topic, settings
        self.timeout_s = settings.ingest_publish_timeout_s
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()

    def send(self, events: Sequence[dict[str, Any]]) -> int:
        """Publish keyed by doc_id and wait for the broker's acknowledgements."""
        try:
            with self._lock:
                if self._producer is None:
                    self._producer = make_producer(
                        self.bootstrap, self.settings, timeout_s=self.timeout_s
                    )
                producer = self._producer
            return publish_events(producer, self.topic, events, self.timeout_s)
        except KafkaError as exc:
            # Some events may still be delivered later: a retry with the same event ids is safe.
            raise TransientError(f"the broker did not accept the events: {exc}") from exc

    def close(self) -> None:
        """Flush and close the producer if one was made."""
        with self._lock:
            if self._producer is not None:
                self._producer.close(timeout=self.timeout_s)
                self._producer = None
