"""HTTP ingest: document events validated against the same contract as `kgstream publish`
(schemas/document_event.v1.json) and published to the documents topic keyed by doc_id. All or
nothing: one invalid event and none is published."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaProducer

from services.core.contracts import schema_errors
from services.core.producer import make_producer, publish_events


def event_errors(event: Any, max_bytes: int) -> list[str]:
    """Why ``event`` is not a valid document event (empty when it is)."""
    size = len(json.dumps(event, ensure_ascii=False).encode("utf-8"))
    if size > max_bytes:
        return [f"oversize: {size} bytes, the limit is {max_bytes}"]
    return schema_errors(event)


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
        errors = event_errors(item, max_bytes)
        if errors:
            problems.append({"index": index, "event_id": _event_id(item), "errors": errors})
    return ([] if problems else list(items)), problems


def delete_event(doc_id: str) -> dict[str, Any]:
    """A delete event for ``doc_id`` with a fresh event id, happening now."""
    return {
        "event_id": f"api-delete-{uuid.uuid4()}",
        "type": "delete",
        "doc_id": doc_id,
        "occurred_at": datetime.now(UTC).isoformat(),
    }


def _event_id(item: Any) -> Any:
    return item.get("event_id") if isinstance(item, dict) else None


class DocumentPublisher:
    """One kafka-python producer per process, connected on first use (the API serves queries
    even while the broker is down). ``send`` blocks: call it from a worker thread."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()

    def send(self, events: Sequence[dict[str, Any]]) -> int:
        """Publish keyed by doc_id and wait for the broker's acknowledgements."""
        with self._lock:
            if self._producer is None:
                self._producer = make_producer(self.bootstrap)
            producer = self._producer
        return publish_events(producer, self.topic, events)

    def close(self) -> None:
        """Flush and close the producer if one was made."""
        with self._lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None
