"""Faults with real processes (issue 8, deliverable 4): a server or worker goes away while the
service runs, comes back, and everything recovers with no manual step; the graph then equals a
clean run of the same events. The indexer SIGKILL case lives in test_crash_recovery.py.

A test that stops a server starts its own (tests/support/faults.py), on its own ports, so the
session's shared PostgreSQL and broker are never disturbed."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from services.communities.lock import RECOMPUTE_LOCK_KEY, libpq_url
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.ports import free_port
from services.core.settings import Settings
from tests.support.cli import kgstream
from tests.support.faults import (
    create_topics,
    group_members,
    indexed_sample,
    kill_group,
    moved,
    own_broker,
    own_postgres,
    start_process,
    unprocessed,
    wait_until,
)
from tests.support.graph import (
    Graph,
    canonical_graph,
    clean_graph,
    graph_diff,
    scalar,
    wait_processed,
)
from tests.support.openai_stub import OpenAIStub
from tests.support.workers import (
    SAMPLE_EVENTS,
    Published,
    Worker,
    end_offsets,
    noticed_broker_gone,
    publish_lines,
    restarted_after_replaced_log,
    sample_lines,
    start_worker,
    wait_committed,
    wait_ready,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def clean(
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> Graph:
    """The graph a clean in-process run builds from the sample (once per session)."""
    return clean_graph(
        str(settings.database_url),
        sample_lines(),
        embedder=embedder,
        extractor=extractor,
        executor=cpu_pool,
        settings=settings,
    )


def readyz(port: int) -> int:
    """The query API's /readyz status, 0 when nothing answers."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code
    except httpx.TransportError:
        return 0


def start_api(settings: Settings, log: Path, port: int) -> Worker:
    """`kgstream worker query-api` on 127.0.0.1:port (loopback: no keys needed)."""
    return start_process(settings, log, "worker", "query-api", env={"KGSTREAM_API_PORT": str(port)})


def assert_all_landed(
    settings: Settings,
    url: str,
    published: list[Published],
    graph_of: str,
    clean: Graph,
) -> None:
    """Every event applied exactly once, its offset committed, and the graph as a clean run
    builds it."""
    ends = end_offsets(published)
    bootstrap = str(settings.kafka_bootstrap_servers)
    committed = wait_committed(bootstrap, settings.consumer_group, settings.documents_topic, ends)
    assert all(committed.get(p, -1) >= e for p, e in ends.items()), (committed, ends)
    assert scalar(url, "SELECT count(*) FROM processed_events") == 48
    assert scalar(url, "SELECT count(*) FROM processed_events WHERE outcome <> 'applied'") == 0
    assert scalar(url, "SELECT count(*) FROM dead_letters") == 0
    got = canonical_graph(graph_of)
    assert len(got["documents"]) == 48
    assert got == clean, graph_diff(got, clean)


def test_postgres_restart_while_events_flow(
    settings: Settings, tmp_path: Path, clean: Graph
) -> None:
    lines = sample_lines()
    bootstrap, topic = str(settings.kafka_bootstrap_servers), settings.documents_topic
    with own_postgres(tmp_path / "pg") as pg:
        url = pg.url
        own = moved(settings, database_url=url)
        port = free_port()
        indexer = start_worker(own, tmp_path / "indexer.log")
        api = start_api(own, tmp_path / "api.log", port)
        try:
            assert wait_ready([indexer]), indexer.output()[-3000:]
            assert wait_until(lambda: readyz(port) == 200, 90), api.output()[-3000:]
            published = publish_lines(bootstrap, topic, lines[:24])
            assert wait_processed(url, 4, timeout=120, poll=0.05) >= 4, indexer.output()[-3000:]

            seen = len(indexer.output())
            pg.stop()
            # Events keep arriving while the database is down; it stays down until the indexer
            # has met the outage (a fixed outage could end before a busy indexer wrote).
            published += publish_lines(bootstrap, topic, lines[24:])
            assert wait_until(lambda: readyz(port) == 503, 60), "the API stayed ready"
            met = wait_until(lambda: "transient failure" in indexer.output()[seen:], 60)
            assert met, indexer.output()[-3000:]
            assert pg.start() == url  # same port: clients reconnect to where they were

            assert wait_processed(url, 48, timeout=180) == 48, indexer.output()[-3000:]
            assert wait_until(lambda: readyz(port) == 200, 30), api.output()[-3000:]
            assert_all_landed(own, url, published, url, clean)
            assert indexer.alive()
            assert api.alive()
            assert "transient failure" in indexer.output(), "the outage was never seen"
        finally:
            api.stop()
            indexer.stop()


def test_broker_restart_with_memory_storage_loses_nothing_after_republish(
    settings: Settings, tmp_path: Path, clean: Graph
) -> None:
    lines = sample_lines()
    url = str(settings.database_url)
    topic = settings.documents_topic
    with own_broker(tmp_path / "broker", settings) as broker:
        bootstrap = broker.bootstrap
        own = moved(settings, kafka_bootstrap_servers=bootstrap)
        indexer = start_worker(own, tmp_path / "indexer.log")
        try:
            assert wait_ready([indexer]), indexer.output()[-3000:]
            publish_lines(bootstrap, topic, lines[:24])
            assert wait_processed(url, 4, timeout=120, poll=0.05) >= 4, indexer.output()[-3000:]

            broker.stop()
            noticed_broker_gone(indexer)  # the outage: seen by the worker, not slept
            assert broker.start() == bootstrap
            # What `kgstream infra up` does on a fresh broker: the topics exist again.
            create_topics(bootstrap, own)
            # Memory storage lost every event not yet consumed, and the committed offsets:
            # the publisher sends again what has not landed (duplicates are skipped by id).
            lost = unprocessed(url, lines[:24])
            published = publish_lines(bootstrap, topic, lost + lines[24:])
            # The indexer notices the replaced log, records what it lost and is restarted,
            # as `kgstream up` would; the new process reads the new log from its start.
            indexer = restarted_after_replaced_log(indexer, own, tmp_path / "indexer-2.log")

            assert wait_processed(url, 48, timeout=180) == 48, indexer.output()[-3000:]
            assert_all_landed(own, url, published, url, clean)
            assert indexer.alive()
            assert scalar(url, "SELECT count(*) FROM broker_losses") == 1
        finally:
            indexer.stop()


@pytest.fixture
def sample_settings(
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> Settings:
    """``settings`` on a database that already holds the indexed sample."""
    url = indexed_sample(settings, embedder=embedder, extractor=extractor, executor=cpu_pool)
    return moved(settings, database_url=url)


def snapshot_rows(url: str) -> dict[str, object]:
    """The published snapshot and what it holds."""
    sid = scalar(url, "SELECT id FROM snapshots WHERE status = 'published'")
    count = "SELECT count(*) FROM {} WHERE snapshot_id = :s"
    return {
        "id": sid,
        **{t: scalar(url, count.format(t), s=sid) for t in SNAPSHOT_TABLES},
    }


SNAPSHOT_TABLES = ("communities", "community_members", "snapshot_entities")


def lock_is_free(url: str) -> bool:
    """A new session can take the recompute lock (and gives it back)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (RECOMPUTE_LOCK_KEY,)).fetchone()
        if row and row[0]:
            conn.execute("SELECT pg_advisory_unlock(%s)", (RECOMPUTE_LOCK_KEY,))
            return True
    return False


def test_communities_worker_killed_mid_recompute(
    sample_settings: Settings, tmp_path: Path, openai_stub: OpenAIStub
) -> None:
    own, url = sample_settings, str(sample_settings.database_url)
    first = kgstream(own, "recompute", "--now", "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    before = snapshot_rows(url)
    assert before["id"] == json.loads(first.stdout)["snapshot_id"]
    assert all(before[t] for t in SNAPSHOT_TABLES), before

    # The next build writes LLM reports through a stub that holds every request: the worker
    # is then mid-recompute (lock held, 'building' row, structure computed) for as long as
    # the test wants.
    release = threading.Event()

    def hold(body: dict[str, Any]) -> str:
        release.wait(60)
        return "{}"

    openai_stub.chat_handler = hold
    worker = start_process(
        own,
        tmp_path / "communities.log",
        "worker",
        "communities",
        env={
            "KGSTREAM_COMMUNITY_REPORTS": "llm",
            "KGSTREAM_OPENAI_BASE_URL": openai_stub.base_url,
            "KGSTREAM_OPENAI_API_KEY": "test",
            "KGSTREAM_COMMUNITIES_CHECK_INTERVAL_S": "1",
            "KGSTREAM_COMMUNITIES_MIN_INTERVAL_S": "0",
        },
    )
    try:
        assert kgstream(own, "recompute").returncode == 0
        building = "SELECT id FROM snapshots WHERE status = 'building'"
        assert wait_until(
            lambda: bool(openai_stub.requests_to("/chat/completions")) and not lock_is_free(url),
            120,
        ), worker.output()[-3000:]
        stale = scalar(url, building)
        assert stale is not None

        worker.kill()
        # The lock lived on the dead process's connection: the server drops it with the socket.
        assert wait_until(lambda: lock_is_free(url), 60)
        assert snapshot_rows(url) == before, "the published snapshot changed"
        assert scalar(url, building) == stale  # left behind until the next build begins
        # Its Leiden pool process (and multiprocessing's resource tracker) go with it.
        gone = wait_until(lambda: not group_members(worker), 60)
        assert gone, f"the killed worker left processes running: {group_members(worker)}"
    finally:
        release.set()
        kill_group(worker)

    again = kgstream(own, "recompute", "--now", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    after = snapshot_rows(url)
    assert after["id"] == json.loads(again.stdout)["snapshot_id"] > stale
    assert {t: after[t] for t in SNAPSHOT_TABLES} == {t: before[t] for t in SNAPSHOT_TABLES}
    statuses = dict(scalar(url, "SELECT array_agg(ARRAY[id::text, status]) FROM snapshots"))
    assert "building" not in statuses.values(), statuses
    assert statuses[str(before["id"])] == "retired"
    assert str(stale) not in statuses, "the half-built snapshot was not cleaned up"


@dataclass(frozen=True)
class Call:
    """One client request: when it started and ended, and its status or transport error."""

    start: float
    end: float
    outcome: str


def query_load(
    port: int, clients: int, stop: threading.Event
) -> tuple[list[Call], list[threading.Thread]]:
    """``clients`` threads asking sample questions (vector mode) until ``stop`` is set."""
    questions = [
        json.loads(line)["question"]
        for line in (SAMPLE_EVENTS.parent / "questions.jsonl").read_text().splitlines()[:5]
    ]
    calls: list[Call] = []

    def run(n: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            i = n
            while not stop.is_set():
                body = {"question": questions[i % len(questions)], "mode": "vector", "k": 5}
                start = time.monotonic()
                try:
                    outcome = str(http.post("/v1/query", json=body).status_code)
                except httpx.TransportError as exc:
                    outcome = type(exc).__name__
                    time.sleep(0.1)  # a client backing off while nothing answers
                calls.append(Call(start, time.monotonic(), outcome))
                i += 1

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    return calls, threads


def test_query_api_killed_under_load(sample_settings: Settings, tmp_path: Path) -> None:
    own, url = sample_settings, str(sample_settings.database_url)
    graph = canonical_graph(url)
    state = (
        "SELECT array[(SELECT count(*) FROM processed_events), (SELECT count(*) FROM snapshots)]"
    )
    rows = scalar(url, state)
    port = free_port()
    apis = [start_api(own, tmp_path / "api-1.log", port)]
    stop = threading.Event()
    try:
        assert wait_until(lambda: readyz(port) == 200, 90), apis[0].output()[-3000:]
        calls, threads = query_load(port, 3, stop)
        assert wait_until(lambda: sum(c.outcome == "200" for c in calls) >= 6, 60), calls[-5:]

        killed = time.monotonic()  # before the kill: clients may see it before we return
        apis[0].kill()
        apis.append(start_api(own, tmp_path / "api-2.log", port))
        assert wait_until(lambda: readyz(port) == 200, 90), apis[1].output()[-3000:]
        ready = time.monotonic()
        assert wait_until(
            lambda: sum(c.outcome == "200" and c.start > ready for c in calls) >= 6, 60
        ), calls[-5:]
        stop.set()
        for t in threads:
            t.join(timeout=60)
    finally:
        stop.set()
        for api in apis:
            api.stop()

    failed = [c for c in calls if c.outcome != "200"]
    assert failed, "no request saw the gap"
    # Clients see connection errors, only while nothing listens: no 5xx, no other answer.
    assert all(not c.outcome.isdigit() for c in failed), failed
    assert all(killed <= c.end and c.start <= ready for c in failed), (killed, ready, failed)
    assert canonical_graph(url) == graph
    assert scalar(url, state) == rows
