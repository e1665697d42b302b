"""Session fixtures: one embedded PostgreSQL and one tansu broker on free ports for the whole
run, a migrated template database cloned per test, and unique topic names per test."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from kafka import KafkaProducer

from services.core.db import migrations
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.broker import EmbeddedBroker
from services.core.infra.postgres import EmbeddedPostgres
from services.core.infra.topics import ensure_topics
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps

pytest_plugins = ["tests.support.fixtures", "tests.support.query_fixtures"]

SAMPLE = Path(__file__).resolve().parents[1] / "services" / "cli" / "sample"
TEMPLATE_DB = "kgstream_template"


@dataclass(frozen=True)
class Infra:
    """Where the session's servers listen."""

    home: Path
    server_url: str  # the server's maintenance database (kgstream)
    bootstrap: str

    def database_url(self, name: str) -> str:
        return self.server_url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infra]:
    home = tmp_path_factory.mktemp("kgstream-session")
    pg, broker = EmbeddedPostgres(home), EmbeddedBroker(home)
    url = pg.start()
    bootstrap = broker.start()
    infra = Infra(home, url, bootstrap)
    _create_db(url, TEMPLATE_DB)
    migrations.upgrade(infra.database_url(TEMPLATE_DB), 384)
    try:
        yield infra
    finally:
        broker.stop()
        pg.stop()
        pg.purge()


def _create_db(server_url: str, name: str, template: str | None = None) -> None:
    dsn = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        suffix = f" TEMPLATE {template}" if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{suffix}')


@pytest.fixture
def database_url(infra: Infra) -> str:
    """A fresh, migrated database for one test (a clone of the template: ~0.1 s)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    _create_db(infra.server_url, name, TEMPLATE_DB)
    return infra.database_url(name)


@pytest.fixture
def topics(infra: Infra) -> dict[str, str]:
    """Unique topic names for one test, created explicitly."""
    tag = uuid.uuid4().hex[:8]
    names = {"documents": f"docs-{tag}", "dlq": f"dlq-{tag}", "snapshots": f"snap-{tag}"}
    ensure_topics(infra.bootstrap, {names["documents"]: 2, names["dlq"]: 1, names["snapshots"]: 1})
    return names


@pytest.fixture
def settings(infra: Infra, database_url: str, topics: dict[str, str]) -> Settings:
    """Settings pointing at this test's database and topics."""
    return Settings(
        home=infra.home,
        database_url=database_url,
        kafka_bootstrap_servers=infra.bootstrap,
        documents_topic=topics["documents"],
        dlq_topic=topics["dlq"],
        snapshots_topic=topics["snapshots"],
        consumer_group=f"group-{uuid.uuid4().hex[:8]}",
    )


@pytest.fixture(scope="session")
def embedder() -> OnnxMiniLmEmbedder:
    return OnnxMiniLmEmbedder()


@pytest.fixture(scope="session")
def extractor() -> SpacyExtractor:
    return SpacyExtractor()


@pytest.fixture(scope="session")
def cpu_pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


@pytest.fixture
async def deps(
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
    infra: Infra,
) -> AsyncIterator[IndexerDeps]:
    """Handler dependencies on the real database; dead letters go to the real broker."""
    assert settings.database_url is not None
    producer = KafkaProducer(bootstrap_servers=infra.bootstrap, acks="all")
    dlq = settings.dlq_topic

    async def publish(key: bytes | None, value: bytes) -> None:
        fut = producer.send(dlq, key=key, value=value)
        await asyncio.to_thread(fut.get, 30)

    engine = make_engine(settings.database_url)
    yield IndexerDeps.from_settings(
        settings,
        engine=engine,
        embedder=embedder,
        extractor=extractor,
        executor=cpu_pool,
        publish_dead_letter=publish,
    )
    await engine.dispose()
    producer.close()


# The suite runs in parallel (pytest-xdist, `make test`: `-n 3 --dist loadgroup`), each worker
# with its own session PostgreSQL, broker and models. Tests that run kgstream's worker processes
# or a whole `kgstream up` are the heavy ones: each group runs on one worker, one test at a
# time, and the groups are about equal (4-5 minutes each on 2 cores, docs/BENCHMARKS.md, "The
# suite"), so no worker holds two of them. They are also `slow`: `make test-quick` leaves them
# out (with the corpus-heavy modules below).
PROCESS_GROUPS = {
    "stack": {"test_chaos", "test_demo", "test_up", "test_up_supervision", "test_mcp_agent"},
    "workers-a": {
        "test_faults", "test_rejoin", "test_stall_status", "test_two_indexers", "test_probes",
        "test_json_logs",
    },
    "workers-b": {
        "test_large_document_lane", "test_pipeline", "test_crash_recovery",
        "test_metrics_endpoints", "test_held_shutdown", "test_eval_and_query_cli",
    },
}  # fmt: skip
SLOW_MODULES = {
    "test_dlq_cli", "test_graph_properties", "test_api_admission", "test_curations",
    "test_communities_recompute", "test_cloudevents_ingest", "test_dead_letter_identity",
    "test_erasure", "test_broker_restart", "test_compressed_batches", "test_api_fuzz",
    "test_replay", "test_error_boundary",
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups and the slow marker by module (see PROCESS_GROUPS)."""
    for item in items:
        module = item.path.stem
        for group, modules in PROCESS_GROUPS.items():
            if module in modules:
                item.add_marker(pytest.mark.xdist_group(group))
                item.add_marker(pytest.mark.slow)
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
