"""Read replicas (issue 20, deliverable 3) against a real streaming standby of the embedded
PostgreSQL (tests/support/replica.py: pg_basebackup -R, primary_conninfo), one primary and
standby for the module: queries read the standby at the primary's snapshot; after_event waits
for the standby to replay; min_snapshot / after_event that never arrive answer 409; a standby
that falls behind is skipped (or 503) and status and /readyz report its lag; a hung standby
costs /readyz nothing; a dead standby falls back to the primary or answers 503, by the setting,
and is read again once it is back; API keys and ingest never read the standby."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from services.core.api_keys import create_key
from services.core.db import migrations
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.infra.postgres import EmbeddedPostgres
from services.core.settings import Settings
from services.indexer.deps import IndexerDeps, RawRecord
from services.indexer.handlers import handle_batch
from services.query_api.app import create_app
from services.query_api.metrics import PrometheusReadObserver
from services.retrieval.compose import graph_holder
from services.retrieval.graph_holder import GraphHolder
from services.retrieval.replica_monitor import ReadPolicy, Replica
from services.retrieval.replicas import ReadRouter
from services.retrieval.service import build_query_service
from tests.conftest import Infra
from tests.support.cli import ROOT, user_env
from tests.support.faults import frozen, postgres_pids
from tests.support.query_fixtures import SAMPLE, publish_communities
from tests.support.replica import Standby

pytestmark = pytest.mark.integration
PROBLEM = "application/problem+json"
SAMPLE_EVENTS = 48  # the whole sample: global mode has its communities to rank
# Conditions below are awaited up to this long: a bound for a broken run on a loaded 2-core
# machine, not a measure (the checks run every 0.1 s).
WAIT_S = 60.0
# /readyz given a long budget: one that waited on a hung standby would take it whole, one that
# does not takes a small part of it, however loaded the machine (a ratio, not a bound).
READYZ_BUDGET_S = 30.0
# Each check given 5 s (the default 0.8 s): on a loaded 2-core machine one check in many took
# longer, and the reports asserted on (/readyz, status) show the last check, an error then.
# The hung-standby test waits for the check to give up, so it only takes longer.
FAST = ReadPolicy(check_s=0.1, retry_s=0.5, max_lag_s=3600.0, wait_max_s=120.0, check_budget_s=5.0)


@dataclass
class Pair:
    """The module's primary and its standby."""

    primary: EmbeddedPostgres
    primary_url: str
    standby: Standby
    snapshot_id: int

    @property
    def standby_url(self) -> str:
        return self.standby.url(self.primary_url.rsplit("/", 1)[1])


async def _index(
    url: str, lines: list[str], embedder: OnnxMiniLmEmbedder, extractor: SpacyExtractor
) -> None:
    """Apply document events through the indexer's handler (as the indexer would)."""
    engine = make_engine(url)
    with ThreadPoolExecutor(max_workers=1) as pool:
        deps = IndexerDeps.from_settings(
            Settings(database_url=url),
            engine=engine,
            embedder=embedder,
            extractor=extractor,
            executor=pool,
            publish_dead_letter=_nowhere,
        )
        records = [RawRecord("t", 0, i, None, line.encode()) for i, line in enumerate(lines)]
        outcomes = await handle_batch(deps, records)
    await engine.dispose()
    assert set(outcomes) == {"applied"}, outcomes


async def _nowhere(key: bytes | None, value: bytes) -> None:
    """No dead letters here."""


@pytest.fixture(scope="module")
async def pair(
    tmp_path_factory: pytest.TempPathFactory,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
) -> AsyncIterator[Pair]:
    primary = EmbeddedPostgres(tmp_path_factory.mktemp("replica-primary"))
    url = primary.start()
    standby = Standby(primary)
    try:
        migrations.upgrade(url, 384)
        lines = (SAMPLE / "events.jsonl").read_text(encoding="utf-8").splitlines()
        await _index(url, lines[:SAMPLE_EVENTS], embedder, extractor)
        snapshot_id = await publish_communities(url, embedder)
        standby.create()
        yield Pair(primary, url, standby, snapshot_id)
    finally:
        standby.remove()
        primary.stop()
        primary.purge()


def reads(target: str) -> float:
    """kgstream_query_reads_total for ``target`` so far."""
    return REGISTRY.get_sample_value("kgstream_query_reads_total", {"target": target}) or 0.0


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Await ``check`` every 0.1 s until it holds (AssertionError after WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_S:g} s waiting for {what}")
        await asyncio.sleep(0.1)


@dataclass
class Api:
    """A query API on the pair and its router."""

    client: httpx.AsyncClient
    router: ReadRouter

    def replica(self) -> dict[str, Any]:
        """replica-1 as the router reports it."""
        return self.router.report()[0]

    async def usable(self) -> bool:
        return bool(self.replica()["usable"])

    async def query(self, **body: Any) -> httpx.Response:
        return await self.client.post("/v1/query", json={"mode": "vector", **body})


@asynccontextmanager
async def api(
    pair: Pair,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
    *,
    fallback: Literal["primary", "unavailable"],
    replicas: bool = True,
    policy: ReadPolicy = FAST,
    graph: GraphHolder | None = None,
    **settings: Any,
) -> AsyncIterator[Api]:
    """A query API reading the standby (``replicas``) with ``fallback``, its monitor running
    (and local mode walking ``graph``, read from the primary, when given)."""
    config = Settings(
        home=infra.home,
        database_url=pair.primary_url,
        kafka_bootstrap_servers=infra.bootstrap,
        **settings,
    )
    engine = make_engine(pair.primary_url)
    policy = ReadPolicy(**{**policy.__dict__, "fallback": fallback})
    found = [Replica("replica-1", pair.standby_url, make_engine(pair.standby_url))]
    router = ReadRouter.of(engine, found if replicas else [], policy, PrometheusReadObserver())
    service = build_query_service(
        config, engine, embedder, extractor, cpu_pool, reads=router, graph=graph
    )
    app = create_app(config, Endpoints(pair.primary_url, infra.bootstrap), service=service)
    router.start()
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield Api(client, router)
    finally:
        await router.close()
        await asyncio.to_thread(app.state.readiness.close)
        await asyncio.to_thread(app.state.publisher.close)
        await engine.dispose()


@pytest.fixture
def make_api(
    pair: Pair,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> Callable[..., Any]:
    def make(**kwargs: Any) -> Any:
        return api(pair, infra, embedder, extractor, cpu_pool, **kwargs)

    return make


@pytest.fixture
def paused(pair: Pair) -> Iterator[None]:
    """The standby's replay paused for the test (resumed after it, whatever happens), once it
    has replayed a transaction (its lag in seconds is unknown until it has: docs/deployment.md)
    and everything before it."""
    pair.standby.sync()
    pair.standby.execute("SELECT pg_wal_replay_pause()")
    try:
        yield
    finally:
        pair.standby.execute("SELECT pg_wal_replay_resume()")


async def test_queries_read_the_standby_at_the_primarys_snapshot(
    pair: Pair, make_api: Callable[..., Any]
) -> None:
    asked = [
        {"question": "Which airport is county-owned?"},
        {"question": "What are the main themes of these documents?", "mode": "global"},
        {"question": "Who directed the film?", "mode": "local"},
    ]
    async with make_api(fallback="primary", replicas=False) as primary:
        expected = [(await primary.query(**body)).json() for body in asked]
    async with make_api(fallback="unavailable") as a:
        await until(a.usable, "the standby to be usable")
        assert a.replica()["in_recovery"] is True
        before, before_primary = reads("replica-1"), reads("primary")
        for body, want in zip(asked, expected, strict=True):
            resp = await a.query(**body)
            assert resp.status_code == 200, resp.text
            got = resp.json()
            assert got["snapshot_id"] == pair.snapshot_id
            assert got["mode_used"] == want["mode_used"]
            assert [c["chunk_id"] for c in got["contexts"]] == [
                c["chunk_id"] for c in want["contexts"]
            ]
            assert [c["id"] for c in got["communities"]] == [c["id"] for c in want["communities"]]
        assert expected[0]["contexts"]
        assert expected[1]["communities"]
        listed = await a.client.get("/v1/communities")
        assert listed.status_code == 200, listed.text
        assert listed.json()["snapshot_id"] == pair.snapshot_id
        assert reads("replica-1") == before + len(asked) + 1
        assert reads("primary") == before_primary


async def test_after_event_waits_for_the_standby_to_replay(
    pair: Pair,
    make_api: Callable[..., Any],
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    paused: None,
) -> None:
    event_id, doc_id = f"ev-{uuid.uuid4().hex[:8]}", f"doc-{uuid.uuid4().hex[:8]}"
    event = {
        "event_id": event_id, "type": "upsert", "doc_id": doc_id, "title": "Quillmere Lighthouse",
        "text": "The Quillmere Lighthouse stands on Varrow Point and was lit in 1871.",
        "occurred_at": "2026-11-26T10:00:00+00:00",
    }  # fmt: skip
    async with make_api(fallback="unavailable") as a:  # a paused standby stays usable here
        await until(a.usable, "the standby to be usable")
        await _index(pair.primary_url, [json.dumps(event)], embedder, extractor)
        before = reads("replica-1")
        asked = asyncio.create_task(
            a.query(question="When was the Quillmere Lighthouse lit?", after_event=event_id)
        )

        async def waiting() -> bool:
            # The standby was asked and lacks the event: the read waits on it. (Its statement
            # shows in the standby's pg_stat_activity only while it runs, about a millisecond
            # of each 50 ms round: a poll of it once missed them all for 20 s, stop 36.)
            gauge = REGISTRY.get_sample_value(
                "kgstream_query_read_waiting", {"target": "replica-1"}
            )
            return bool(gauge)

        await until(waiting, "the query to wait on the standby for the event")
        assert not asked.done()  # replay is paused: the standby cannot have the event
        await asyncio.to_thread(pair.standby.execute, "SELECT pg_wal_replay_resume()")
        resp = await asked
        assert resp.status_code == 200, resp.text
        assert resp.json()["contexts"][0]["doc_id"] == doc_id
        assert reads("replica-1") == before + 1


async def test_a_standby_walks_the_held_graph_only_once_it_shows_the_graphs_changes(
    pair: Pair,
    make_api: Callable[..., Any],
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    walks: list[int],
) -> None:
    # The held graph is read from the primary. A read of a standby that has not replayed
    # the graph's last change must not walk it (it could reach passages the read cannot see):
    # it walks the database, and walks the held graph again once the standby has caught up.
    holder = graph_holder(Settings(database_url=pair.primary_url), pair.primary_url)
    local = {
        "question": "Who directed the film that was shot in or around Leland, North Carolina?",
        "mode": "local",
    }
    engine = make_engine(pair.primary_url)
    try:  # an admin reads every document: the held graph is walked for it (docs/retrieval.md)
        _, key = await create_key(engine, ["admin"])
    finally:
        await engine.dispose()
    admin = {"Authorization": f"Bearer {key}"}

    async def ask() -> httpx.Response:
        resp: httpx.Response = await a.client.post("/v1/query", json=local, headers=admin)
        assert resp.status_code == 200, resp.text
        assert resp.json()["mode_used"] == "local"
        return resp

    try:
        caught_watermark = (await holder.caught_up()).watermark
        async with make_api(fallback="unavailable", graph=holder) as a:
            await until(a.usable, "the standby to be usable")
            await asyncio.to_thread(pair.standby.sync)
            before = reads("replica-1")
            caught = await ask()
            assert caught.status_code == 200, caught.text
            assert len(walks) == 1  # the standby shows the graph's watermark
            await asyncio.to_thread(pair.standby.execute, "SELECT pg_wal_replay_pause()")
            try:
                event = {
                    "event_id": f"ev-{uuid.uuid4().hex[:8]}", "type": "upsert",
                    "doc_id": f"doc-{uuid.uuid4().hex[:8]}", "title": "Ostrel Ferry",
                    "text": "The Ostrel Ferry crosses the Lune estuary from Brisk Harbour.",
                    "occurred_at": "2026-11-29T10:00:00+00:00",
                }  # fmt: skip
                await _index(pair.primary_url, [json.dumps(event)], embedder, extractor)
                newer = await holder.caught_up()
                behind = await ask()
                assert behind.status_code == 200, behind.text
                assert len(walks) == 1, "a standby behind the held graph walked it"
                assert reads("replica-1") == before + 2  # both read the standby
            finally:
                await asyncio.to_thread(pair.standby.execute, "SELECT pg_wal_replay_resume()")
            await asyncio.to_thread(pair.standby.sync)
            again = await ask()
            assert again.status_code == 200, again.text
            assert len(walks) == 2  # caught up: the held graph again
            assert again.json()["contexts"]
            assert behind.json()["contexts"]
            assert newer.watermark > caught_watermark
    finally:
        await asyncio.to_thread(holder.close)


@pytest.mark.parametrize("replicas", [False, True])
async def test_what_never_arrives_is_409(
    pair: Pair, make_api: Callable[..., Any], replicas: bool
) -> None:
    quick = ReadPolicy(**{**FAST.__dict__, "wait_max_s": 0.3})
    async with make_api(fallback="primary", replicas=replicas, policy=quick) as a:
        if replicas:
            await until(a.usable, "the standby to be usable")
        later = pair.snapshot_id + 1000
        resp = await a.query(question="airports", min_snapshot=later)
        assert resp.status_code == 409, resp.text
        assert resp.headers["content-type"] == PROBLEM
        body = resp.json()
        assert body["title"] == "Not caught up"
        assert body["waited_for"] == {"min_snapshot": later, "after_event": None}
        assert body["seen_snapshot"] == pair.snapshot_id
        assert body["waited_s"] >= 0.3
        assert f"snapshot >= {later}" in body["detail"]
        missing = await a.query(question="airports", after_event="never-published")
        assert missing.status_code == 409, missing.text
        assert missing.json()["waited_for"]["after_event"] == "never-published"
        # what is there already is answered at once
        applied = json.loads((SAMPLE / "events.jsonl").read_text().splitlines()[0])["event_id"]
        there = await a.query(
            question="airports", min_snapshot=pair.snapshot_id, after_event=applied
        )
        assert there.status_code == 200, there.text


async def test_a_standby_behind_the_max_lag_is_skipped_and_reported(
    pair: Pair, make_api: Callable[..., Any], infra: Infra, paused: None
) -> None:
    strict = ReadPolicy(**{**FAST.__dict__, "max_lag_s": 0.5})
    cold = {"readiness_budget_s": 30.0}  # /readyz's first check on a cold engine: not under test
    async with (
        make_api(fallback="primary", policy=strict, **cold) as lenient,
        make_api(fallback="unavailable", policy=strict, **cold) as refusing,
    ):
        await _on_primary(pair, "CREATE TABLE replica_lag_probe (x int)")  # WAL to replay

        async def behind() -> bool:
            both = (lenient.replica(), refusing.replica())
            return all(r["lag_bytes"] and not r["usable"] for r in both)

        await until(behind, "both routers to see the standby behind")
        before, fell_back = reads("primary"), _fallbacks("no_usable_replica")
        resp = await lenient.query(question="Which airport is county-owned?")
        assert resp.status_code == 200, resp.text
        assert reads("primary") == before + 1
        assert _fallbacks("no_usable_replica") == fell_back + 1
        refused = await refusing.query(question="Which airport is county-owned?")
        assert refused.status_code == 503, refused.text
        assert refused.headers["content-type"] == PROBLEM
        assert "no replica is usable" in refused.json()["detail"]

        ready = await lenient.client.get("/readyz")
        assert ready.status_code == 200, ready.text
        (replica,) = ready.json()["replicas"]
        assert replica["replay_paused"] is True
        assert replica["lag_bytes"] > 0
        assert replica["lag_s"] > 0.5
        assert replica["usable"] is False
        api_status = await lenient.client.get("/v1/status")  # the monitor's last check
        assert api_status.status_code == 200, api_status.text
        (checked,) = api_status.json()["replicas"]
        assert checked["lag_bytes"] > 0
        assert checked["usable"] is False
        not_ready = await refusing.client.get("/readyz")
        assert not_ready.status_code == 503
        assert "KGSTREAM_READ_FALLBACK=unavailable" in not_ready.json()["detail"]

        status = await asyncio.to_thread(_status, pair, infra, "--json")
        (measured,) = json.loads(status)["replicas"]
        assert measured["name"] == "replica-1"
        assert measured["replay_paused"] is True
        assert measured["lag_bytes"] > 0
        assert measured["usable"] is False
        assert "***" in measured["database"]  # the password is masked
        text_status = await asyncio.to_thread(_status, pair, infra)
        assert "replica-1" in text_status
        assert "replay paused: NOT USED (behind the max lag)" in text_status
    await _on_primary(pair, "DROP TABLE replica_lag_probe")


async def test_a_hung_standby_costs_readyz_nothing(
    pair: Pair, make_api: Callable[..., Any]
) -> None:
    async with make_api(fallback="primary", readiness_budget_s=READYZ_BUDGET_S) as a:
        await until(a.usable, "the standby to be usable")
        with frozen(postgres_pids(pair.standby)):
            await until(lambda: _errs(a), "the monitor to find the standby not answering")
            started = time.monotonic()
            ready = await a.client.get("/readyz")
            took = time.monotonic() - started
            assert ready.status_code == 200, ready.text
            assert took / READYZ_BUDGET_S < 0.5, took
            assert "did not answer" in ready.json()["replicas"][0]["error"]
            resp = await a.query(question="Which airport is county-owned?")
            assert resp.status_code == 200, resp.text  # from the primary: not waiting on it
        await until(a.usable, "the thawed standby to be usable again")


async def test_keys_and_ingest_stay_on_the_primary(
    pair: Pair, make_api: Callable[..., Any], topics: dict[str, str], paused: None
) -> None:
    engine = make_engine(pair.primary_url)
    _, key = await create_key(engine, ["query", "ingest"], tenant="acme")  # not on the standby
    await engine.dispose()
    async with make_api(
        fallback="unavailable", auth="required", documents_topic=topics["documents"]
    ) as a:
        await until(a.usable, "the standby to be usable")
        headers = {"Authorization": f"Bearer {key}"}
        before = reads("replica-1")
        resp = await a.client.post(
            "/v1/query", json={"question": "airports", "mode": "vector"}, headers=headers
        )
        assert resp.status_code == 200, resp.text  # the key was read on the primary
        assert reads("replica-1") == before + 1  # the query's read went to the standby
        event = {
            "event_id": f"ev-{uuid.uuid4().hex[:8]}", "type": "upsert", "doc_id": "acme-1",
            "title": "t", "text": "Some text.", "occurred_at": "2026-11-26T10:00:00+00:00",
        }  # fmt: skip
        posted = await a.client.post("/v1/documents", json=event, headers=headers)
        assert posted.status_code == 202, posted.text
        assert reads("replica-1") == before + 1  # ingest read nothing there


async def test_a_dead_standby_falls_back_or_503_and_is_read_again_once_back(
    pair: Pair, make_api: Callable[..., Any]
) -> None:
    async with (
        make_api(fallback="primary") as lenient,
        make_api(fallback="unavailable") as refusing,
    ):
        await until(lenient.usable, "the standby to be usable")
        await until(refusing.usable, "the standby to be usable")
        await asyncio.to_thread(pair.standby.kill)
        try:
            before = reads("primary")
            resp = await lenient.query(question="Which airport is county-owned?")
            assert resp.status_code == 200, resp.text
            assert reads("primary") == before + 1
            refused = await refusing.query(question="Which airport is county-owned?")
            assert refused.status_code == 503, refused.text
            assert refused.headers["content-type"] == PROBLEM
            await until(lambda: _errs(refusing), "the monitor to find the standby gone")
            not_ready = await refusing.client.get("/readyz")
            assert not_ready.status_code == 503
            assert not_ready.json()["replicas"][0]["error"]
        finally:
            await asyncio.to_thread(pair.standby.start)
        await until(refusing.usable, "the restarted standby to be usable again")
        before = reads("replica-1")
        resp = await refusing.query(question="Which airport is county-owned?")
        assert resp.status_code == 200, resp.text
        assert reads("replica-1") == before + 1


async def _on_primary(pair: Pair, statement: str) -> None:
    engine = make_engine(pair.primary_url)
    async with engine.begin() as conn:
        await conn.execute(text(statement))
    await engine.dispose()


def _fallbacks(reason: str) -> float:
    found = REGISTRY.get_sample_value("kgstream_query_read_fallbacks_total", {"reason": reason})
    return found or 0.0


async def _errs(a: Api) -> bool:
    return bool(a.replica()["error"])


def _status(pair: Pair, infra: Infra, *flags: str) -> str:
    """`kgstream status` with the standby as a read replica whose max lag is 0.5 s."""
    env = user_env(
        infra.home,
        database_url=pair.primary_url,
        kafka_bootstrap_servers=infra.bootstrap,
        database_read_url=pair.standby_url,
        read_max_lag_s="0.5",
    )
    done = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "status", *flags],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
