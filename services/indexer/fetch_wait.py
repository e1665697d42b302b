"""How long a fetch may wait at the broker for records (aiokafka's ``fetch_max_wait_ms``).
faust hard-codes 1.5 s for its worker consumer; the embedded broker (tansu) does not answer a
waiting fetch when records arrive, so a record published to an idle partition waited about a
quarter of that before the indexer saw it (docs/BENCHMARKS.md, "Freshness"). Real Kafka
answers as soon as there is data; there a shorter wait only polls an idle topic more often
(ten small requests a second at the default 0.1 s).

The same consumer thread also runs services/indexer/coordinator_errors.py: group-coordination
errors that aiokafka would otherwise hold back from faust for good."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from services.indexer.coordinator_errors import surface_errors


def consumer_class(fetch_max_wait_s: float) -> type[faust_aiokafka.Consumer]:
    """faust's aiokafka consumer, with fetches that wait at most ``fetch_max_wait_s``."""
    wait_ms = max(1, round(fetch_max_wait_s * 1000))

    class FetchWaitThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
            consumer = super()._create_worker_consumer(transport)
            consumer._fetch_max_wait_ms = wait_ms  # read by start(); faust passes 1500
            return consumer

        async def on_start(self) -> None:
            await super().on_start()  # on the consumer's thread: creates and starts it
            self._surface = asyncio.create_task(surface_errors(self._ensure_consumer()))

        async def on_thread_stop(self) -> None:
            surface: asyncio.Task[None] | None = getattr(self, "_surface", None)
            if surface is not None:
                surface.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await surface
            await super().on_thread_stop()

    class FetchWaitConsumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return FetchWaitThread(self, loop=self.loop, beacon=self.beacon)

    return FetchWaitConsumer


def install(app: faust.App, fetch_max_wait_s: float) -> None:
    """Make ``app``'s consumer (created when the worker starts) use that fetch wait."""
    app.transport.Consumer = consumer_class(fetch_max_wait_s)  # type: ignore[misc]
