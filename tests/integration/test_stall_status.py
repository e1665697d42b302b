"""A consumer held by a transient failure shows as stalled in `kgstream status` and
/v1/status, with the failure, and clears without a manual step when the failure ends (issue 8,
finding 8: a stuck indexer used to look healthy). A frozen consumer shows as stalled in the
query API's /readyz too, by the same rule (issue 18, finding 4), and after a broker restart the
recorded offsets follow the broker's new ones, so lag and stalls show again (finding 8)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from services.core.db.engine import make_engine
from services.core.infra.manager import Endpoints
from services.core.infra.ports import free_port
from services.core.settings import Settings
from services.core.status import database_status
from services.query_api.app import create_app
from tests.support.cli import kgstream
from tests.support.faults import create_topics, moved, own_broker, start_process, wait_until
from tests.support.graph import scalar, wait_processed
from tests.support.records import document_event
from tests.support.workers import (
    end_offsets,
    noticed_broker_gone,
    publish_lines,
    restarted_after_replaced_log,
    sample_lines,
    start_worker,
    stop_workers,
    wait_ready,
)

pytestmark = pytest.mark.integration


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
        await asyncio.to_thread(app.state.readiness.close)
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
        # The outage lasts until the test has seen the stall (a row in fault_on), not for a
        # number of retries: their backoff was a window of seconds the checks had to fit in.
        conn.execute("CREATE TABLE fault_on (x int)")
        conn.execute("INSERT INTO fault_on VALUES (1)")
        conn.execute(
            "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " IF NEW.doc_id = 'flaky' AND EXISTS (SELECT 1 FROM fault_on) THEN"
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
    watched = settings.model_copy(update={"indexer_stall_after_s": 2.0, "readiness_budget_s": 30.0})
    worker = start_worker(watched, tmp_path / "indexer.log")
    try:
        publish_lines(str(settings.kafka_bootstrap_servers), settings.documents_topic,
                      [json.dumps(e) for e in events])  # fmt: skip
        # Stalled by its retries (the lag rule may say so a moment earlier).
        deadline = time.monotonic() + 90
        while True:
            stalled = wait_for(settings, want_stalled=True)
            [held] = [p for p in stalled["partitions"] if p["stalled"]]
            if (held["retrying_for_s"] or 0) >= 2.0:
                break
            assert time.monotonic() < deadline, stalled
            time.sleep(0.5)
        assert "SerializationFailure" in held["last_error"]
        ready = readyz(watched)
        assert ready == {"status": "ready", "indexer": "stalled"}
        shown = kgstream(watched, "status")
        assert "STALLED" in shown.stdout, shown.stdout + shown.stderr
        assert "SerializationFailure" in shown.stdout
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM fault_on")
        # The failure passes; the worker catches up by itself and the stall clears.
        assert wait_processed(url, 3, timeout=90) == 3, worker.output()[-3000:]
        recovered = wait_for(settings, want_stalled=False)
        assert all(p["retrying_for_s"] is None for p in recovered["partitions"])
        assert readyz(watched) == {"status": "ready", "indexer": "ok"}
        assert worker.alive()
    finally:
        stop_workers([worker])
    assert scalar(url, "SELECT count(*) FROM processed_events WHERE outcome = 'applied'") == 3


def api_readyz(port: int) -> tuple[int, dict[str, Any]]:
    """(status, body) of /readyz of the query API process on ``port``; (0, {}) when nothing
    answers in time."""
    try:
        resp = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    except httpx.TransportError:
        return 0, {}
    return resp.status_code, resp.json()


def test_a_frozen_indexer_shows_stalled_in_readyz(settings: Settings, tmp_path: Path) -> None:
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic, lines = settings.documents_topic, sample_lines()
    watched = settings.model_copy(update={"indexer_stall_after_s": 3.0})
    port = free_port()
    indexer = start_worker(watched, tmp_path / "indexer.log")
    api = start_process(
        watched, tmp_path / "api.log", "worker", "query-api", env={"KGSTREAM_API_PORT": str(port)}
    )
    try:
        assert wait_ready([indexer]), indexer.output()[-3000:]
        assert wait_until(lambda: api_readyz(port)[0] == 200, 90), api.output()[-3000:]
        publish_lines(bootstrap, topic, lines[:4])
        assert wait_processed(url, 4, timeout=120) == 4, indexer.output()[-3000:]
        assert wait_until(lambda: api_readyz(port)[1].get("indexer") == "ok", 30)
        os.kill(indexer.pid, signal.SIGSTOP)
        seen: list[tuple[int, object]] = []
        try:
            for line in lines[4:34]:  # one event a second while the consumer is frozen
                publish_lines(bootstrap, topic, [line])
                code, body = api_readyz(port)
                seen.append((code, body.get("indexer")))
                if body.get("indexer") == "stalled":
                    break
                time.sleep(1)
        finally:
            os.kill(indexer.pid, signal.SIGCONT)
        # Stalled, and still ready: the database answers, answers are only stale.
        assert seen[-1] == (200, "stalled"), seen
        assert wait_processed(url, 4 + len(seen), timeout=120) == 4 + len(seen)
        assert wait_until(lambda: api_readyz(port)[1].get("indexer") == "ok", 60)
    finally:
        api.stop()
        indexer.stop()


def stored_offsets(url: str, group: str, topic: str) -> dict[int, int]:
    """partition -> next_offset as indexer_progress records it."""
    rows = scalar(
        url,
        "SELECT coalesce(jsonb_object_agg(partition, next_offset), '{}') FROM indexer_progress"
        " WHERE consumer_group = :g AND topic = :t",
        g=group,
        t=topic,
    )
    return {int(p): int(o) for p, o in rows.items()}


def test_progress_follows_the_offsets_of_a_restarted_broker(
    settings: Settings, tmp_path: Path
) -> None:
    url, topic, group = (
        str(settings.database_url),
        settings.documents_topic,
        settings.consumer_group,
    )
    lines = sample_lines()
    with own_broker(tmp_path / "broker", settings) as broker:
        bootstrap = broker.bootstrap
        own = moved(settings, kafka_bootstrap_servers=bootstrap, indexer_stall_after_s=3.0)
        indexer = start_worker(own, tmp_path / "indexer.log")
        try:
            assert wait_ready([indexer]), indexer.output()[-3000:]
            first = publish_lines(bootstrap, topic, lines[:30])
            assert wait_processed(url, 30, timeout=180) == 30, indexer.output()[-3000:]
            assert wait_until(lambda: stored_offsets(url, group, topic) == end_offsets(first), 30)

            broker.stop()  # memory storage: the new broker's offsets start at 0 again
            noticed_broker_gone(indexer)  # the outage: seen by the worker, not slept
            assert broker.start() == bootstrap
            create_topics(bootstrap, own)
            again = publish_lines(bootstrap, topic, lines[30:40])
            indexer = restarted_after_replaced_log(indexer, own, tmp_path / "indexer-2.log")
            assert wait_processed(url, 40, timeout=180) == 40, indexer.output()[-3000:]
            new_ends = end_offsets(again)
            assert wait_until(
                lambda: {p: stored_offsets(url, group, topic)[p] for p in new_ends} == new_ends, 30
            ), (stored_offsets(url, group, topic), new_ends, end_offsets(first))

            # The consumer freezes: records wait beyond the recorded offsets, so it shows.
            os.kill(indexer.pid, signal.SIGSTOP)
            try:
                shown = []
                for line in lines[40:48]:
                    publish_lines(bootstrap, topic, [line])
                    shown.append(status(own)["indexer"]["stalled"])
                    if shown[-1]:
                        break
                    time.sleep(1)
                assert wait_until(lambda: status(own)["indexer"]["stalled"], 20), shown
            finally:
                os.kill(indexer.pid, signal.SIGCONT)
            assert wait_processed(url, 40 + len(shown), timeout=180) == 40 + len(shown)
        finally:
            indexer.stop()
