"""Every producer of kgstream's own goes on after the broker restarts, without a restart of
its process (issue 30, finding 2). On 79715af the query API's publisher kept its idempotent
kafka-python producer, which the restarted broker no longer knew: every POST /v1/documents
answered 503 (`InitProducerIdResponse: [Error -1] UnknownError`) until the API restarted.
These tests restart a broker of their own (memory storage: it forgets producers, topics and
records) between two sends of one long-lived producer."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from services.communities.snapshots import kafka_announcer
from services.core.errors import TransientError
from services.core.infra.broker import EmbeddedBroker
from services.core.producer import make_producer, publish_events
from services.core.settings import Settings
from services.query_api.ingest import DocumentPublisher
from tests.support.faults import create_topics, moved, own_broker
from tests.support.records import document_event, event_ids_on

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0  # a poll's deadline, not a bound under test: the old code never recovered


def restart(broker: EmbeddedBroker, settings: Settings) -> None:
    """Stop and start the broker on its port, with the topics again (as `kgstream up` does)."""
    broker.stop()
    assert broker.start() == settings.kafka_bootstrap_servers
    create_topics(broker.bootstrap, settings)


def first_success(send: object, attempts: list[str]) -> bool:
    """Call ``send`` until it goes through or the deadline passes; failures are kept."""
    assert callable(send)
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            send()
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and tried again
            attempts.append(f"{type(exc).__name__}: {exc}"[:200])
            time.sleep(0.5)
        else:
            return True
    return False


def test_http_ingest_publisher_recovers_from_a_broker_restart(
    settings: Settings, tmp_path: Path
) -> None:
    with own_broker(tmp_path, settings) as broker:
        own = moved(settings, kafka_bootstrap_servers=broker.bootstrap, ingest_publish_timeout_s=3)
        publisher = DocumentPublisher(broker.bootstrap, own.documents_topic, own)
        try:
            assert publisher.send([document_event(event_id="before")]) == 1
            assert publisher.state == {"ingest": "ok"}
            broker.stop()
            with pytest.raises(TransientError):
                publisher.send([document_event(event_id="while-down")])
            assert publisher.state["ingest"] == "unavailable"  # what /readyz reports
            restart(broker, own)
            attempts: list[str] = []
            after = [document_event(event_id="after")]
            sent = first_success(lambda: publisher.send(after), attempts)
            assert sent, f"the publisher never sent again after the restart: {attempts[-3:]}"
            assert publisher.state == {"ingest": "ok"}
            assert "after" in event_ids_on(broker.bootstrap, own.documents_topic)
        finally:
            publisher.close()


def test_a_cli_producer_recovers_from_a_broker_restart(settings: Settings, tmp_path: Path) -> None:
    """The producer `kgstream publish` and `kgstream dlq replay` use, kept across a restart."""
    with own_broker(tmp_path, settings) as broker:
        own = moved(settings, kafka_bootstrap_servers=broker.bootstrap)
        producer = make_producer(broker.bootstrap, own, timeout_s=3)
        topic = own.documents_topic
        try:
            assert publish_events(producer, topic, [document_event(event_id="before")], 10) == 1
            restart(broker, own)
            attempts: list[str] = []

            def send() -> None:
                publish_events(producer, topic, [document_event(event_id="after")], 5)

            assert first_success(send, attempts), f"never sent again: {attempts[-3:]}"
            assert "after" in event_ids_on(broker.bootstrap, topic)
        finally:
            producer.close(timeout=1)


async def test_the_snapshot_announcer_recovers_from_a_broker_restart(
    settings: Settings, tmp_path: Path
) -> None:
    """The communities worker's producer (snapshot announcements), kept across a restart: on
    79715af it was an idempotent producer made once per process."""
    with own_broker(tmp_path, settings) as broker:
        own = moved(settings, kafka_bootstrap_servers=broker.bootstrap)
        announce = kafka_announcer(
            lambda: make_producer(broker.bootstrap, own, timeout_s=3), own.snapshots_topic, 5
        )
        try:
            await announce({"snapshot_id": 1})
            restart(broker, own)
            sent = False
            deadline = time.monotonic() + DEADLINE_S
            failures: list[str] = []
            while not sent and time.monotonic() < deadline:
                try:
                    await announce({"snapshot_id": 2})
                    sent = True
                except Exception as exc:  # noqa: BLE001 - recorded, tried again
                    failures.append(f"{type(exc).__name__}: {exc}"[:200])
                    await asyncio.sleep(0.5)
            assert sent, f"never announced again: {failures[-3:]}"
        finally:
            announce.close()
