"""Session fixtures for the query API tests: the 48-document sample indexed once through the
indexer's handler, and a clone of it with a hand-made published community snapshot (the
community engine is tested on its own; here the rows are what global mode reads)."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from services.core.db.engine import make_engine, vector_literal
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from services.indexer.deps import IndexerDeps, RawRecord
from services.indexer.handlers import handle_batch
from tests.conftest import TEMPLATE_DB, Infra

SAMPLE = Path(__file__).resolve().parents[2] / "services" / "cli" / "sample"
# (id, level, parent, title, summary, member entities: names matching any of these patterns)
COMMUNITIES = [
    (1, 0, None, "Airports in the United States",
     "Watertown International Airport in New York and Alexandria International Airport in "
     "Louisiana are public airports serving their regions.", ["%Airport%"]),
    (2, 0, None, "Songs, music and composers",
     "The Hukilau Song was written after a luau on Oahu; Carl Philipp Emanuel Bach was a "
     "German composer and musician.", ["%Hukilau%", "%Bach%", "%Oahu%"]),
    (3, 1, 1, "Watertown International Airport",
     "Watertown International Airport is a county-owned airport near Watertown, New York.",
     ["%Watertown%"]),
]  # fmt: skip


def server_dsn(database_url: str) -> str:
    """libpq DSN of the server's maintenance database behind a SQLAlchemy URL."""
    base = database_url.replace("postgresql+psycopg://", "postgresql://")
    return base.rsplit("/", 1)[0] + "/postgres"


def clone_database(database_url: str, template: str) -> str:
    """A new database copied from ``template``. PostgreSQL copies only a database nobody is
    connected to: a session a test left open on a session-scoped template (an app whose
    lifespan never ran keeps its readiness connection) is ended first rather than failing
    every later clone."""
    name = f"q_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn(database_url), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (template,),
        )
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return database_url.rsplit("/", 1)[0] + "/" + name


async def _nowhere(key: bytes | None, value: bytes) -> None:
    """Dead letters stay in the table: the sample has none."""


async def index_sample(
    database_url: str, embedder: OnnxMiniLmEmbedder, extractor: SpacyExtractor
) -> None:
    """Apply the sample events through the indexer's handler, 16 at a time."""
    settings = Settings(database_url=database_url)
    engine = make_engine(database_url)
    lines = (SAMPLE / "events.jsonl").read_text(encoding="utf-8").splitlines()
    with ThreadPoolExecutor(max_workers=1) as pool:
        deps = IndexerDeps.from_settings(
            settings,
            engine=engine,
            embedder=embedder,
            extractor=extractor,
            executor=pool,
            publish_dead_letter=_nowhere,
        )
        for start in range(0, len(lines), 16):
            records = [
                RawRecord("sample", 0, start + i, None, line.encode())
                for i, line in enumerate(lines[start : start + 16])
            ]
            outcomes = await handle_batch(deps, records)
            assert set(outcomes) == {"applied"}, outcomes
    await engine.dispose()


async def publish_communities(database_url: str, embedder: OnnxMiniLmEmbedder) -> int:
    """Insert a published snapshot with COMMUNITIES; returns the snapshot id."""
    engine = make_engine(database_url)
    async with engine.begin() as conn:
        snapshot_id = int(
            await conn.scalar(
                text(
                    "INSERT INTO snapshots (status, watermark, communities, levels, published_at)"
                    " VALUES ('published', 0, :n, 2, now()) RETURNING id"
                ),
                {"n": len(COMMUNITIES)},
            )
            or 0
        )
        for cid, level, parent, title, summary, patterns in COMMUNITIES:
            vector = embedder.embed([f"{title}\n{summary}"])[0]
            await conn.execute(
                text(
                    "INSERT INTO communities (snapshot_id, id, level, parent_id, size, fingerprint,"
                    " title, summary, report, rating, embedding) VALUES (:s, :id, :l, :p, 0,"
                    " 'fp', :t, :sum, CAST(:r AS jsonb), 5.0, CAST(:e AS vector))"
                ),
                {"s": snapshot_id, "id": cid, "l": level, "p": parent, "t": title,
                 "sum": summary, "r": json.dumps({"title": title}), "e": vector_literal(vector)},
            )  # fmt: skip
            await conn.execute(
                text(
                    "INSERT INTO community_members (snapshot_id, community_id, entity_id)"
                    " SELECT :s, :c, id FROM entities WHERE name ILIKE ANY(:p)"
                ),
                {"s": snapshot_id, "c": cid, "p": patterns},
            )
            await conn.execute(
                text(
                    "UPDATE communities SET size = (SELECT count(*) FROM community_members"
                    " WHERE snapshot_id = :s AND community_id = :c) WHERE snapshot_id = :s"
                    " AND id = :c"
                ),
                {"s": snapshot_id, "c": cid},
            )
    await engine.dispose()
    return snapshot_id


@pytest.fixture(scope="session")
async def sample_db(infra: Infra, embedder: OnnxMiniLmEmbedder, extractor: SpacyExtractor) -> str:
    """A database with the 48-document sample indexed and no community snapshot."""
    url = clone_database(infra.server_url, TEMPLATE_DB)
    await index_sample(url, embedder, extractor)
    return url


@pytest.fixture(scope="session")
async def community_db(sample_db: str, embedder: OnnxMiniLmEmbedder) -> str:
    """The indexed sample plus a published snapshot of COMMUNITIES."""
    url = clone_database(sample_db, sample_db.rsplit("/", 1)[1])
    await publish_communities(url, embedder)
    return url
