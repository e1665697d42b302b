"""Publishing document events with kafka-python (the CLI and the HTTP ingest use this)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.producer.future import FutureRecordMetadata

from services.core.contracts import decode_json, encode_event, event_problems
from services.core.errors import PermanentError
from services.core.settings import Settings


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


KAFKA_DEFAULT_REQUEST_BYTES = 1_048_576  # kafka-python's max_request_size default (1 MiB)
RECORD_HEADROOM_BYTES = 4096  # the key (doc_id: ≤ 512 chars, ≤ 2048 bytes) plus batch framing
log = logging.getLogger(__name__)
LOG_OVERHEAD_BYTES = 12  # offset + size prefix: Kafka's message.max.bytes default is 1 MiB + 12


def max_request_size(settings: Settings) -> int:
    """kafka-python's ``max_request_size`` for our producers: room for the largest valid event
    (``max_document_bytes``) with its key and record framing, and never below kafka-python's
    default. Brokers and topics must accept it (``topic_max_message_bytes``)."""
    return max(KAFKA_DEFAULT_REQUEST_BYTES, settings.max_document_bytes + RECORD_HEADROOM_BYTES)


def topic_max_message_bytes(settings: Settings) -> int:
    """The ``max.message.bytes`` topics need to accept every record our producers may send."""
    return max_request_size(settings) + LOG_OVERHEAD_BYTES


def make_producer(
    bootstrap: str, settings: Settings, *, timeout_s: float | None = None
) -> KafkaProducer:
    """A producer that waits for all in-sync replicas; keys and values are bytes. Sized by
    ``max_request_size``; ``timeout_s`` bounds connecting and blocking in ``send``."""
    bounds = {}
    if timeout_s is not None:
        ms = max(1, int(timeout_s * 1000))
        bounds = {"bootstrap_timeout_ms": ms, "max_block_ms": ms}
    return KafkaProducer(
        bootstrap_servers=bootstrap.split(","),
        acks="all",
        linger_ms=5,
        retries=5,
        # Not idempotent (kafka-python 3 is by default): the indexer already applies an event
        # once by its event id, and an idempotent producer's id lives in the broker: a broker
        # that forgets it (the embedded one on restart; a cluster that lost its transaction
        # state) fails every later send with InitProducerId errors, for good (issue 30).
        enable_idempotence=False,
        client_id="kgstream-publish",
        max_request_size=max_request_size(settings),
        **bounds,
    )


# kafka-python's delivery_timeout_ms default: a record not delivered by then fails, and a
# producer that still held it can then close.
DELIVERY_TIMEOUT_S = 120.0


def discard(producer: KafkaProducer, wait_s: float) -> threading.Thread:
    """Close a producer whose sends failed, without waiting for it. kafka-python's close()
    flushes first and raises while records are pending (a broker that is gone), before it stops
    the producer's sender thread: closed that way once, the thread kept running for good, one
    more per broker outage. Here the close is tried again, each try waiting ``wait_s``, until
    the pending records have expired (DELIVERY_TIMEOUT_S) and it completes; then it gives up,
    saying so. Returns the closing thread."""

    def run() -> None:
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S + 2 * wait_s
        while True:
            try:
                producer.close(timeout=wait_s)
            except KafkaError as exc:
                if time.monotonic() < deadline:
                    continue
                log.warning("a discarded producer did not close: %s: %s", type(exc).__name__, exc)
            return

    closing = threading.Thread(target=run, name="kgstream-producer-discard", daemon=True)
    closing.start()
    return closing


def validate_line(raw: bytes, max_bytes: int) -> tuple[dict[str, object] | None, str | None]:
    """(event, None) when the line is a valid document event of at most ``max_bytes`` (as
    read, and in the wire form it is sent in), else (None, reason). Never raises."""
    if len(raw) > max_bytes:
        return None, f"oversize: {len(raw)} bytes, the limit is {max_bytes}"
    try:
        obj = decode_json(raw)
    except PermanentError as exc:
        label = "not UTF-8" if exc.reason == "undecodable" else "invalid JSON"
        return None, f"{label}: {exc.detail.removeprefix('not UTF-8: ')}"
    problems = event_problems(obj, max_bytes)
    if problems:
        if problems[0].startswith("oversize"):
            return None, problems[0]
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


Record = tuple[bytes | None, bytes] | tuple[bytes | None, bytes, Sequence[tuple[str, bytes]]]
"""(key, value) or (key, value, headers)."""


def send_each(
    producer: KafkaProducer,
    topic: str,
    records: Iterable[Record],
    timeout_s: float = 30.0,
) -> list[KafkaError | None]:
    """Send (key, value[, headers]) records and wait for the broker; per record, None when it
    was acknowledged or the error that stopped it (never raised). ``timeout_s`` bounds the
    whole wait for acknowledgements, not each step of it."""
    pending: list[FutureRecordMetadata | KafkaError] = []
    no_metadata: KafkaTimeoutError | None = None
    for key, value, *more in records:
        if no_metadata is not None:  # each send would block max_block_ms again
            pending.append(no_metadata)
            continue
        headers = list(more[0]) if more and more[0] else None
        try:
            pending.append(producer.send(topic, key=key, value=value, headers=headers))
        except KafkaTimeoutError as exc:  # no metadata within max_block_ms: the broker is gone
            no_metadata = exc
            pending.append(exc)
        except KafkaError as exc:  # e.g. too large: this record only
            pending.append(exc)
    # One deadline: the flush and then each acknowledgement waiting the full timeout in turn
    # made a 5 s budget last 10 s and more with the broker gone.
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(KafkaError):
        producer.flush(timeout=timeout_s)
    outcomes: list[KafkaError | None] = []
    for item in pending:
        if isinstance(item, KafkaError):
            outcomes.append(item)
            continue
        try:
            item.get(timeout=max(0.0, deadline - time.monotonic()))
            outcomes.append(None)
        except KafkaTimeoutError:
            outcomes.append(KafkaTimeoutError(f"not acknowledged within {timeout_s:g} s"))
        except KafkaError as exc:
            outcomes.append(exc)
    return outcomes


def send_all(
    producer: KafkaProducer,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes]],
    timeout_s: float = 30.0,
) -> int:
    """Send (key, value) records and wait until the broker has acknowledged every one; raise
    the first error otherwise."""
    outcomes = send_each(producer, topic, records, timeout_s)
    for error in outcomes:
        if error is not None:
            raise error
    return len(outcomes)


def event_records(events: Iterable[Mapping[str, object]]) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) records for events: keyed by doc_id, in their wire form."""
    for event in events:
        yield str(event["doc_id"]).encode("utf-8"), encode_event(event)


def publish_numbered(
    producer: KafkaProducer,
    topic: str,
    numbered: Sequence[tuple[int, Mapping[str, object]]],
    report: PublishReport,
    timeout_s: float = 30.0,
) -> None:
    """Send (line number, event) pairs; count each acknowledged one in ``report`` and record
    each the broker did not take as rejected, with the reason (nothing is raised)."""
    outcomes = send_each(producer, topic, event_records(e for _, e in numbered), timeout_s)
    for (number, _), error in zip(numbered, outcomes, strict=True):
        if error is None:
            report.sent += 1
        else:
            report.rejected.append(Rejected(number, f"not sent: {type(error).__name__}: {error}"))


def publish_events(
    producer: KafkaProducer,
    topic: str,
    events: Iterable[Mapping[str, object]],
    timeout_s: float = 30.0,
) -> int:
    """Send events keyed by doc_id and wait until the broker has them all."""
    return send_all(producer, topic, event_records(events), timeout_s)
