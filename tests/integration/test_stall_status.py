"""A consumer held by a transient failure shows as stalled in `kgstream status` and
/v1/status, with the failure, and clears without a manual step when the failure ends (issue 8,
finding 8: a stuck indexer used to look healthy)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from services.core.db.engine import make_engine
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.core.status import database_status
from services.query_api.app import create_app
from tests.support.cli import kgstream
from tests.support.graph import scalar, wait_processed
from tests.support.records import document_event
from tests.support.workers import publish_lines, start_worker, stop_workers

pytestmark = pytest.mark.integration
FAILURES = 5  # transient failures before the database lets doc 'flaky' in: ~15 s of backoff


def status(settings: Settings) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        engine = make_engine(str(settings.database_url))
        try:
            return await database_status(
                engine, bootstrap=settings.kafka_bootstrap_servers, stall_after_s=2.0
            )
        finally:
            await engine.dispose()

    return asyncio.run(go())


def readyz(settings: Settings) -> dict[str, Any]:
    """/readyz of a query API on these settings (status and indexer fields)."""
    app = create_app(settings, Endpoints(str(settings.database_url), "127.0.0.1:9"))

    async def go() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            body: dict[str, Any] = (await client.get("/readyz")).json()
        await app.state.service.engine.dispose()
        return {k: body[k] for k in ("status", "indexer")}

    return asyncio.run(go())


def wait_for(settings: Settings, want_stalled: bool, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc: dict[str, Any] = status(settings)["indexer"]
        if doc["partitions"] and doc["stalled"] is want_stalled:
            return doc
        assert time.monotonic() < deadline, doc
        time.sleep(0.5)


def test_a_retrying_consumer_shows_stalled_then_recovers(
    settings: Settings, tmp_path: Path
) -> None:
    url = str(settings.database_url)
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE fault_seq")
        conn.execute(
            "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.doc_id = 'flaky' AND nextval('fault_seq') <= {FAILURES} THEN"
            "  RAISE EXCEPTION 'injected outage' USING ERRCODE = '40001';"
            " END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER fault BEFORE INSERT ON chunks FOR EACH ROW EXECUTE FUNCTION fault()"
        )
    events = [
        document_event(event_id="s1", doc_id="steady-1"),
        document_event(event_id="f1", doc_id="flaky"),
        document_event(event_id="s2", doc_id="steady-2"),
    ]
    watched = settings.model_copy(update={"indexer_stall_after_s": 2.0})
    worker = start_worker(watched, tmp_path / "indexer.log")
    try:
        publish_lines(str(settings.kafka_bootstrap_servers), settings.documents_topic,
                      [json.dumps(e) for e in events])  # fmt: skip
        stalled = wait_for(settings, want_stalled=True)
        [held] = [p for p in stalled["partitions"] if p["stalled"]]
        assert held["retrying_for_s"] >= 2.0
        assert "SerializationFailure" in held["last_error"]
        ready = readyz(watched)
        assert ready == {"status": "ready", "indexer": "stalled"}
        shown = kgstream(watched, "status")
        assert "STALLED" in shown.stdout, shown.stdout + shown.stderr
        assert "SerializationFailure" in shown.stdout
        # The failure passes; the worker catches up by itself and the stall clears.
        assert wait_processed(url, 3, timeout=90) == 3, worker.output()[-3000:]
        recovered = wait_for(settings, want_stalled=False)
        assert all(p["retrying_for_s"] is None for p in recovered["partitions"])
        assert readyz(watched) == {"status": "ready", "indexer": "ok"}
        assert worker.alive()
    finally:
        stop_workers([worker])
    assert scalar(url, "SELECT count(*) FROM processed_events WHERE outcome = 'applied'") == 3
