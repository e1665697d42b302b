"""Publishing document events with kafka-python (the CLI and the HTTP ingest use this)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaProducer

from services.core.contracts import schema_errors


@dataclass(frozen=True)
class Rejected:
    """A line that was not published, and why."""

    line: int
    reason: str


@dataclass
class PublishReport:
    """What a publish run did."""

    sent: int = 0
    rejected: list[Rejected] = field(default_factory=list)


def make_producer(bootstrap: str) -> KafkaProducer:
    """A producer that waits for all in-sync replicas; keys and values are bytes."""
    return KafkaProducer(
        bootstrap_servers=bootstrap.split(","),
        acks="all",
        linger_ms=5,
        retries=5,
        client_id="kgstream-publish",
    )


def validate_line(raw: bytes, max_bytes: int) -> tuple[dict[str, object] | None, str | None]:
    """(event, None) when the line is a valid document event, else (None, reason)."""
    if len(raw) > max_bytes:
        return None, f"oversize: {len(raw)} bytes, the limit is {max_bytes}"
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8: {exc}"
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc}"
    problems = schema_errors(obj)
    if problems:
        return None, "contract violation: " + "; ".join(problems)
    if not isinstance(obj, dict):  # the schema already requires an object; this narrows the type
        return None, "contract violation: not an object"
    return obj, None


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines as bytes with 1-based numbers; one undecodable line is rejected on its
    own instead of aborting the whole file."""
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                yield number, line.rstrip(b"\r\n")


def send_all(
    producer: KafkaProducer, topic: str, records: Iterable[tuple[bytes | None, bytes]]
) -> int:
    """Send (key, value) records and wait until the broker has acknowledged every one."""
    futures = [producer.send(topic, key=key, value=value) for key, value in records]
    producer.flush()
    for fut in futures:
        fut.get(timeout=30)
    return len(futures)


def publish_events(producer: KafkaProducer, topic: str, events: Iterable[dict[str, object]]) -> int:
    """Send events keyed by doc_id and wait until the broker has them all."""
    return send_all(
        producer,
        topic,
        (
            (
                str(event["doc_id"]).encode("utf-8"),
                json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
            )
            for event in events
        ),
    )
