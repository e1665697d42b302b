"""Hand aiokafka's group-coordination errors back to aiokafka, so that it retries the join.

aiokafka's coordinator parks an error it meets while (re)joining the group (a failed partition
assignment, an unexpected JoinGroup or SyncGroup answer, a failing heartbeat) until the
application reads it through ``getmany()``/``getone()`` (``check_errors()``), and does nothing
else meanwhile. faust reads records from aiokafka's fetcher directly and never calls either, so
such an error stops the consumer's group membership for good: its partitions revoked, never
assigned again, and no further log line. This task, on the consumer's thread, reads the error
(logging it) every ``interval_s``, after which aiokafka's coordination loop tries again."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)


async def surface_errors(consumer: Any, interval_s: float = 1.0) -> None:
    """Run until cancelled, or until aiokafka's coordination task itself has ended (then only
    a new process helps: the rejoin watchdog's job)."""
    coordinator = consumer._coordinator
    while True:
        await asyncio.sleep(interval_s)
        if coordinator._coordination_task.done():
            log.error("the consumer's group coordination has stopped: it cannot rejoin")
            return
        if coordinator._pending_exception is None:
            continue
        try:
            coordinator.check_errors()
        except KafkaError as exc:
            log.warning("consumer group coordination failed (%r): rejoining the group", exc)
