"""Explicit topic creation: tansu auto-creates topics with 4 partitions, whatever we need."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

from services.core.infra.errors import InfraError


def ensure_topics(
    bootstrap: str,
    topics: Mapping[str, int],
    timeout: float = 30.0,
    *,
    max_message_bytes: int | None = None,
) -> None:
    """Create the missing ``topics`` (name -> partitions) and wait until metadata lists them.

    ``max_message_bytes`` sets the new topics' ``max.message.bytes`` (pass
    ``services.core.producer.topic_max_message_bytes(settings)`` so that every record our
    producers may send fits). Existing topics are left as they are, whatever their partition
    count and limits.
    """
    from kafka import KafkaAdminClient  # noqa: PLC0415  (slow import, only when needed)
    from kafka.admin import NewTopic  # noqa: PLC0415
    from kafka.errors import KafkaError, TopicAlreadyExistsError  # noqa: PLC0415

    if not topics:
        return
    ms = int(min(timeout, 30.0) * 1000)
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="kgstream-topics",
            request_timeout_ms=ms,
            bootstrap_timeout_ms=ms,
        )
    except KafkaError as exc:
        raise InfraError(f"cannot reach the Kafka broker at {bootstrap}: {exc}") from exc
    try:
        existing = set(admin.list_topics())
        configs = {} if max_message_bytes is None else {"max.message.bytes": str(max_message_bytes)}
        for name, partitions in topics.items():
            if name in existing:
                continue
            # One request per topic: kafka-python raises on the first error of a batch,
            # which would hide whether the other topics were created.
            # Created concurrently by another process: fine.
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(name, partitions, 1, topic_configs=configs)], timeout_ms=ms
                )
        _wait_for(admin, set(topics), bootstrap, timeout)
    except KafkaError as exc:
        raise InfraError(f"cannot create topics {sorted(topics)} on {bootstrap}: {exc}") from exc
    finally:
        admin.close()


def _wait_for(admin: Any, names: set[str], bootstrap: str, timeout: float) -> None:
    from kafka.errors import KafkaError  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    missing = set(names)
    while True:
        try:
            described = admin.describe_topics(sorted(missing))
        except KafkaError:
            # Some brokers answer an unknown topic with an error instead of an empty entry.
            described = []
        missing -= {t["name"] for t in described if t["error_code"] == 0 and t["partitions"]}
        if not missing:
            return
        if time.monotonic() > deadline:
            raise InfraError(f"topics {sorted(missing)} did not appear on {bootstrap}")
        time.sleep(0.1)
