"""services/indexer/fetch_wait.py: the indexer's faust consumer fetches with the configured
wait instead of faust's hard-coded 1.5 s (no broker: the consumer is built, not started)."""

from __future__ import annotations

import faust

from services.indexer import fetch_wait


async def test_the_worker_consumer_fetches_with_the_configured_wait() -> None:
    app = faust.App("fetch-wait-test", broker="kafka://127.0.0.1:9", web_enabled=False)
    fetch_wait.install(app, 0.1)
    thread = app.consumer._thread  # type: ignore[attr-defined]
    consumer = thread._create_worker_consumer(app.transport)
    assert consumer._fetch_max_wait_ms == 100


async def test_without_it_faust_waits_one_and_a_half_seconds() -> None:
    app = faust.App("fetch-wait-faust", broker="kafka://127.0.0.1:9", web_enabled=False)
    consumer = app.consumer._thread._create_worker_consumer(app.transport)  # type: ignore[attr-defined]
    assert consumer._fetch_max_wait_ms == 1500
