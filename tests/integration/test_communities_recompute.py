"""The communities engine against the real PostgreSQL (and the real broker for the snapshot
event): the sample corpus is ingested once through ``handle_record`` and cloned per test."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from services.communities.app import build_writer, leiden_config
from services.communities.keyphrases import TITLE_PHRASES, theme_title
from services.communities.lock import libpq_url, recompute_lock
from services.communities.policy import Policy
from services.communities.recompute import RecomputeDeps
from services.communities.reports import ExtractiveWriter
from services.communities.snapshots import kafka_announcer
from services.communities.worker import run_now, tick
from services.core.change_state import read_change_state
from services.core.contracts import schema_errors
from services.core.db.engine import make_engine
from services.core.embedding import Embedder
from services.core.llm.client import process_client
from services.core.settings import Settings
from services.core.status import database_status
from services.indexer.handlers import IndexerDeps, RawRecord, handle_record
from tests.conftest import SAMPLE, Infra
from tests.support.openai_stub import OpenAIStub
from tests.support.records import records_on

pytestmark = pytest.mark.integration

_TEMPLATES: dict[str, str] = {}  # corpus name -> template database, built once per session
_offsets = iter(range(10**9))
NEVER = 10**9  # seconds: no staleness trigger, no minimum interval in the way
EAGER = Policy(threshold=0.10, min_interval_s=0, max_staleness_s=NEVER)


@dataclass(frozen=True)
class Corpus:
    """A database holding the ingested sample, and indexer deps writing to it."""

    url: str
    indexer: IndexerDeps


def sample_events() -> list[dict[str, Any]]:
    lines = (SAMPLE / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def ingest(deps: IndexerDeps, events: list[dict[str, Any]]) -> None:
    for event in events:
        record = RawRecord("docs", 0, next(_offsets), b"k", json.dumps(event).encode())
        assert await handle_record(deps, record) in ("applied", "unchanged", "deleted")


def _create_db(infra: Infra, name: str, template: str) -> None:
    with psycopg.connect(libpq_url(infra.server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')


@pytest.fixture
async def corpus(deps: IndexerDeps, settings: Settings, infra: Infra) -> AsyncIterator[Corpus]:
    """The 48-document sample, ingested once; each test gets its own clone."""
    assert settings.database_url is not None
    if "sample" not in _TEMPLATES:
        await ingest(deps, sample_events())
        await deps.engine.dispose()  # CREATE DATABASE ... TEMPLATE needs no open connections
        name = f"corpus_{uuid.uuid4().hex[:8]}"
        _create_db(infra, name, settings.database_url.rsplit("/", 1)[1])
        _TEMPLATES["sample"] = name
        yield Corpus(settings.database_url, deps)
        return
    name = f"t_{uuid.uuid4().hex[:12]}"
    _create_db(infra, name, _TEMPLATES["sample"])
    url = infra.database_url(name)
    engine = make_engine(url)
    try:
        yield Corpus(url, dataclasses.replace(deps, engine=engine))
    finally:
        await engine.dispose()


@pytest.fixture
async def community_deps(
    corpus: Corpus, settings: Settings, embedder: Embedder
) -> AsyncIterator[RecomputeDeps]:
    deps = RecomputeDeps(
        engine=make_engine(corpus.url),
        database_url=corpus.url,
        leiden=leiden_config(settings),
        writer=ExtractiveWriter(),
        embedder=embedder,
    )
    try:
        yield deps
    finally:
        await deps.engine.dispose()


async def scalar(deps: RecomputeDeps, sql: str, **params: Any) -> Any:
    async with deps.engine.connect() as conn:
        return await conn.scalar(text(sql), params)


async def test_first_build_publishes_a_nested_snapshot(
    community_deps: RecomputeDeps, settings: Settings, infra: Infra
) -> None:
    deps = community_deps
    producer_deps = dataclasses.replace(
        deps, announce=kafka_announcer(lambda: _producer(infra), settings.snapshots_topic)
    )
    result = await tick(producer_deps, EAGER)
    assert result.outcome == "published"
    assert result.result is not None
    assert result.result.reason == "first_build"
    snap = result.result.snapshot
    assert snap.communities > 0
    assert snap.levels >= 1
    assert snap.reports_generated == snap.communities
    assert snap.reports_reused == 0
    assert snap.nodes == await scalar(deps, "SELECT count(*) FROM entities")
    assert snap.watermark == await scalar(deps, "SELECT max(id) FROM graph_changes")
    # Children nest in their parents; every report has a title and an embedding.
    orphans = await scalar(
        deps,
        "SELECT count(*) FROM community_members m JOIN communities c"
        " ON (c.snapshot_id, c.id) = (m.snapshot_id, m.community_id) WHERE c.parent_id IS NOT NULL"
        " AND NOT EXISTS (SELECT 1 FROM community_members p WHERE p.snapshot_id = m.snapshot_id"
        " AND p.community_id = c.parent_id AND p.entity_id = m.entity_id)",
    )
    assert orphans == 0
    assert (
        await scalar(deps, "SELECT count(*) FROM communities WHERE title = '' OR embedding IS NULL")
        == 0
    )
    assert await scalar(deps, "SELECT count(*) FROM snapshot_entities") == snap.nodes
    # Per entity: its community at each level, top first, and PageRank summing to 1.
    mismatched = await scalar(
        deps,
        "SELECT count(*) FROM snapshot_entities se WHERE se.community_ids IS DISTINCT FROM"
        " coalesce((SELECT array_agg(m.community_id ORDER BY c.level) FROM community_members m"
        " JOIN communities c ON (c.snapshot_id, c.id) = (m.snapshot_id, m.community_id)"
        " WHERE m.snapshot_id = se.snapshot_id AND m.entity_id = se.entity_id), '{}')",
    )
    assert mismatched == 0
    assert await scalar(deps, "SELECT sum(pagerank) FROM snapshot_entities") == pytest.approx(1.0)
    # After the build nothing changed: ratio 0, nothing to do.
    async with deps.engine.connect() as conn:
        assert (await read_change_state(conn)).ratio == 0.0
    assert (await tick(deps, EAGER)).outcome == "idle"
    status = await database_status(deps.engine)
    assert status["change_ratio"] == 0.0
    assert status["snapshot"]["id"] == snap.id
    # The announcement is on the snapshots topic and follows its contract.
    events = [json.loads(m.value) for m in records_on(infra.bootstrap, settings.snapshots_topic)]
    assert [e["snapshot_id"] for e in events] == [snap.id]
    assert schema_errors(events[0], "snapshot_published.v1") == []


def _producer(infra: Infra) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=infra.bootstrap, acks="all")


async def test_threshold_decides_the_recompute(
    community_deps: RecomputeDeps, corpus: Corpus
) -> None:
    deps = community_deps
    first = await run_now(deps)
    assert first is not None
    events = sample_events()
    edited = dict(
        events[0],
        event_id="edit-1",
        version=2,
        text=events[0]["text"] + " Albert Einstein visited Paris in 1921.",
    )
    await ingest(corpus.indexer, [edited])
    async with deps.engine.connect() as conn:
        state = await read_change_state(conn)
    ratio = state.ratio
    assert 0 < ratio < 1
    assert state.changed == await scalar(
        deps,
        "SELECT count(*) FROM (SELECT DISTINCT kind, ref_id FROM graph_changes WHERE id > :w) c",
        w=first.snapshot.watermark,
    )
    assert ratio == state.changed / (first.snapshot.nodes + first.snapshot.edges)
    below = dataclasses.replace(EAGER, threshold=ratio * 1.001)
    assert (await tick(deps, below)).outcome == "idle"
    above = dataclasses.replace(EAGER, threshold=ratio * 0.999)
    result = await tick(deps, above)
    assert result.outcome == "published"
    assert result.result is not None
    assert result.result.reason == "threshold"
    assert result.result.snapshot.watermark > first.snapshot.watermark
    assert await scalar(deps, "SELECT count(*) FROM snapshots WHERE status = 'published'") == 1


def report_json(body: dict[str, Any]) -> str:
    """The stub's report: titled after the first entity line of the prompt."""
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    entity = next((ln[2:].split(" | ")[0] for ln in prompt.splitlines() if " | " in ln), "?")
    return json.dumps(
        {
            "title": f"About {entity}",
            "summary": prompt.splitlines()[0],
            "findings": [{"summary": entity, "explanation": "first entity"}],
            "rating": 7,
        }
    )


async def test_small_change_regenerates_only_changed_reports(
    community_deps: RecomputeDeps, corpus: Corpus, openai_stub: OpenAIStub
) -> None:
    openai_stub.chat_handler = report_json
    llm = Settings(openai_base_url=openai_stub.base_url, community_reports="llm", llm_model="m")
    writer = build_writer(llm, process_client(llm))
    assert writer is not None
    deps = dataclasses.replace(community_deps, writer=writer)
    first = await run_now(deps)
    assert first is not None
    chats = len(openai_stub.requests_to("/chat/completions"))
    assert chats == first.snapshot.reports_generated == first.snapshot.communities
    parents = [
        r
        for r in openai_stub.requests_to("/chat/completions")
        if "Sub-community reports:" in r.body["messages"][1]["content"]
    ]
    assert parents, "parents are written from their children's reports"

    # Edit one of the 48 documents (~2% of the corpus): a sentence linking two of its entities.
    events = sample_events()
    edited = dict(
        events[0],
        event_id="edit-0",
        version=2,
        text=events[0]["text"] + " Irwin Shaw later met Marlon Brando in Paris.",
    )
    await ingest(corpus.indexer, [edited])
    second = await run_now(deps)
    assert second is not None
    calls = len(openai_stub.requests_to("/chat/completions")) - chats
    changed = await scalar(
        deps,
        "SELECT count(*) FROM communities n WHERE n.snapshot_id = :new AND NOT EXISTS"
        " (SELECT 1 FROM communities o WHERE o.snapshot_id = :old"
        " AND o.fingerprint = n.fingerprint)",
        new=second.snapshot.id,
        old=first.snapshot.id,
    )
    snap = second.snapshot
    assert 0 < calls == snap.reports_generated == changed
    assert snap.reports_reused + snap.reports_generated == snap.communities
    assert calls <= 0.2 * first.snapshot.communities, (calls, first.snapshot.communities)
    reused_titles = await scalar(
        deps,
        "SELECT count(*) FROM communities n JOIN communities o ON o.fingerprint = n.fingerprint"
        " AND o.snapshot_id = :old WHERE n.snapshot_id = :new AND n.title = o.title"
        " AND n.embedding = o.embedding",
        new=snap.id,
        old=first.snapshot.id,
    )
    assert reused_titles == snap.reports_reused
    used = await scalar(
        deps, "SELECT sum(prompt_tokens) FROM token_usage WHERE purpose = 'community_reports'"
    )
    assert used > 0


async def test_offline_reports_are_titled_by_their_themes_and_rewritten_once(
    community_deps: RecomputeDeps,
) -> None:
    deps = community_deps
    first = await run_now(deps)
    assert first is not None
    async with deps.engine.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT title, summary FROM communities WHERE snapshot_id = :s"),
                {"s": first.snapshot.id},
            )
        ).all()
    assert len(rows) == first.snapshot.communities
    for title, summary in rows:
        # What the passages are about opens the summary; the title names the first themes.
        assert summary.startswith("Themes: "), summary
        themes = summary.removeprefix("Themes: ").split(". ", 1)[0].split(", ")
        assert title == theme_title(themes[:TITLE_PHRASES])
        assert title[1:] == title[1:].lower(), "no names in a theme title"
    # Reports written by the earlier offline rule are rewritten once, then reused again.
    async with deps.engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE communities SET report = jsonb_set(report, '{writer}', '\"extractive\"')"
                " WHERE snapshot_id = :s"
            ),
            {"s": first.snapshot.id},
        )
    upgraded = await run_now(deps)
    assert upgraded is not None
    assert upgraded.snapshot.reports_generated == upgraded.snapshot.communities
    again = await run_now(deps)
    assert again is not None
    assert again.snapshot.reports_reused == again.snapshot.communities


async def test_readers_see_one_whole_snapshot_while_publishing(
    community_deps: RecomputeDeps,
) -> None:
    deps = dataclasses.replace(community_deps, writer=None, embedder=None, keep=1)
    assert await run_now(deps) is not None
    stop = asyncio.Event()
    seen: set[int] = set()
    reads = 0

    async def reader() -> None:
        nonlocal reads
        async with deps.engine.connect() as conn:
            await conn.execution_options(isolation_level="REPEATABLE READ")
            while not stop.is_set():
                async with conn.begin():
                    pub = (
                        await conn.execute(
                            text(
                                "SELECT id, communities, nodes FROM snapshots"
                                " WHERE status = 'published'"
                            )
                        )
                    ).all()
                    assert len(pub) == 1
                    sid, communities, nodes = pub[0]
                    stored = await conn.scalar(
                        text("SELECT count(*) FROM communities WHERE snapshot_id = :s"), {"s": sid}
                    )
                    entities = await conn.scalar(
                        text("SELECT count(*) FROM snapshot_entities WHERE snapshot_id = :s"),
                        {"s": sid},
                    )
                    assert (stored, entities) == (communities, nodes)
                seen.add(sid)
                reads += 1
                await asyncio.sleep(0)

    readers = [asyncio.create_task(reader()) for _ in range(2)]
    for _ in range(4):
        assert await run_now(deps) is not None
    stop.set()
    await asyncio.gather(*readers)
    assert len(seen) >= 2
    assert reads > 10
    # keep=1: only the published snapshot is left.
    assert await scalar(deps, "SELECT count(*) FROM snapshots") == 1


async def test_second_worker_skips_while_the_lock_is_held(
    community_deps: RecomputeDeps, caplog: pytest.LogCaptureFixture
) -> None:
    deps = community_deps
    async with recompute_lock(deps.database_url) as held:
        assert held
        with caplog.at_level(logging.INFO, logger="services.communities.worker"):
            result = await tick(deps, EAGER)
        assert result.outcome == "locked"
        assert "another worker holds the recompute lock" in caplog.text
        assert await run_now(deps) is None
        assert await scalar(deps, "SELECT count(*) FROM snapshots") == 0
    # Released: the next tick builds.
    assert (await tick(deps, EAGER)).outcome == "published"


async def test_recompute_request_is_answered_by_the_next_snapshot(
    community_deps: RecomputeDeps,
) -> None:
    from services.communities.requests import request_recompute, wait_for_answer

    deps = dataclasses.replace(community_deps, writer=None, embedder=None)
    assert await run_now(deps) is not None
    assert (await tick(deps, EAGER)).outcome == "idle"
    at = await request_recompute(deps.engine)
    assert await wait_for_answer(deps.engine, at, timeout_s=0) is None
    result = await tick(deps, EAGER)
    assert result.outcome == "published"
    assert result.result is not None
    assert result.result.reason == "requested"
    answer = await wait_for_answer(deps.engine, at, timeout_s=5)
    assert answer is not None
    assert answer.snapshot_id == result.result.snapshot.id
    assert (await tick(deps, EAGER)).outcome == "idle"


async def test_failed_build_leaves_the_published_snapshot(community_deps: RecomputeDeps) -> None:
    class Broken(ExtractiveWriter):
        name = "broken"  # another writer: no report is reused, so it is called

        def write(self, inputs: Any) -> Any:  # noqa: ARG002
            raise RuntimeError("writer down")

    first = await run_now(community_deps)
    assert first is not None
    broken = dataclasses.replace(community_deps, writer=Broken())
    with pytest.raises(RuntimeError, match="writer down"):
        await run_now(broken)
    statuses = await scalar(
        community_deps, "SELECT string_agg(status, ',' ORDER BY id) FROM snapshots"
    )
    assert statuses == "published,failed"


ORPHANS = (
    "SELECT (SELECT count(*) FROM communities c"
    "        WHERE NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.id = c.snapshot_id))"
    " + (SELECT count(*) FROM snapshot_entities e"
    "        WHERE NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.id = e.snapshot_id))"
    " + (SELECT count(*) FROM community_members m WHERE NOT EXISTS (SELECT 1 FROM communities c"
    "        WHERE c.snapshot_id = m.snapshot_id AND c.id = m.community_id))"
)


async def rows_of(deps: RecomputeDeps, snapshot_id: int) -> list[int]:
    return [
        await scalar(deps, f"SELECT count(*) FROM {table} WHERE snapshot_id = :s", s=snapshot_id)  # noqa: S608 - constant table names
        for table in ("communities", "community_members", "snapshot_entities")
    ]


async def test_pruning_deletes_the_rows_of_dropped_and_failed_snapshots(
    community_deps: RecomputeDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.communities import snapshots

    deps = dataclasses.replace(community_deps, writer=None, embedder=None, keep=1)
    first = await run_now(deps)
    assert first is not None
    assert all(await rows_of(deps, first.snapshot.id))
    real_publish = snapshots.publish

    async def publish_fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("publish interrupted")

    # Rows written, then the publish fails: a 'failed' snapshot with all its rows.
    monkeypatch.setattr(snapshots, "publish", publish_fails)
    with pytest.raises(RuntimeError, match="publish interrupted"):
        await run_now(deps)
    failed = await scalar(deps, "SELECT id FROM snapshots WHERE status = 'failed'")
    assert all(await rows_of(deps, failed))
    monkeypatch.setattr(snapshots, "publish", real_publish)
    last = await run_now(deps)
    assert last is not None
    assert await scalar(deps, "SELECT string_agg(status, ',') FROM snapshots") == "published"
    assert await rows_of(deps, first.snapshot.id) == [0, 0, 0]
    assert await rows_of(deps, failed) == [0, 0, 0]
    assert all(await rows_of(deps, last.snapshot.id))
    assert await scalar(deps, ORPHANS) == 0


async def test_a_crash_mid_write_leaves_no_rows(
    community_deps: RecomputeDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.communities import writer

    deps = dataclasses.replace(community_deps, writer=None, embedder=None)

    def crash(*args: Any) -> bytes:  # communities and members are already sent
        raise RuntimeError("crash mid-write")

    monkeypatch.setattr(writer, "entities_copy", crash)
    with pytest.raises(RuntimeError, match="crash mid-write"):
        await run_now(deps)
    failed = await scalar(deps, "SELECT id FROM snapshots WHERE status = 'failed'")
    assert failed is not None
    assert await rows_of(deps, failed) == [0, 0, 0]


async def test_rows_are_not_written_for_a_snapshot_no_longer_building(
    community_deps: RecomputeDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.communities import writer

    deps = dataclasses.replace(community_deps, writer=None, embedder=None)
    real_write = writer.write_rows

    async def taken_over(engine: Any, snapshot_id: int, *args: Any) -> None:
        # Another worker found the row 'building' and marked it failed before the write.
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE snapshots SET status = 'failed' WHERE id = :s"), {"s": snapshot_id}
            )
        await real_write(engine, snapshot_id, *args)

    monkeypatch.setattr("services.communities.recompute.write_rows", taken_over)
    with pytest.raises(RuntimeError, match="no longer 'building'"):
        await run_now(deps)
    failed = await scalar(deps, "SELECT id FROM snapshots WHERE status = 'failed'")
    assert await rows_of(deps, failed) == [0, 0, 0]
    assert await scalar(deps, "SELECT count(*) FROM snapshots WHERE status = 'published'") == 0
