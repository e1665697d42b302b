"""Hostile input and the limits that protect the API, against the real app, database and broker:
every refusal is a 4xx (or 503/504) problem+json, never a 500; and the size limits of the
contract, the producers and `kgstream publish` agree at their edges."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from services.core.api_keys import create_key
from services.core.contracts import encode_event
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.infra.ports import free_port
from services.core.infra.topics import ensure_topics
from services.core.producer import PublishReport, publish_numbered, topic_max_message_bytes
from services.core.settings import Settings
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.conftest import Infra
from tests.integration.test_auth import app_routes
from tests.integration.test_query_llm_ingest import consume
from tests.support.cli import env_for, kgstream
from tests.support.graph import rows_of
from tests.support.server import serve

pytestmark = pytest.mark.integration
PROBLEM = "application/problem+json"
LIMIT = 1_000_000  # the default KGSTREAM_MAX_DOCUMENT_BYTES

AppFactory = Callable[..., Any]


@pytest.fixture
async def make_client(
    sample_db: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[Callable[..., Any]]:
    """make_client(**settings) -> (client, topic): the app on the sample database and a fresh
    documents topic; ``bootstrap=`` points the publisher elsewhere."""
    engines: list[Any] = []
    apps: list[Any] = []

    async def make(bootstrap: str | None = None, **overrides: Any) -> tuple[Any, str]:
        topic = f"docs-{uuid.uuid4().hex[:8]}"
        bootstrap = bootstrap or infra.bootstrap
        if bootstrap == infra.bootstrap:
            ensure_topics(infra.bootstrap, {topic: 2})
        settings = Settings(
            database_url=sample_db,
            kafka_bootstrap_servers=bootstrap,
            documents_topic=topic,
            **overrides,
        )
        from services.retrieval.service import build_query_service

        engine = make_engine(sample_db)
        engines.append(engine)
        service = build_query_service(settings, engine, embedder, extractor, cpu_pool)
        app = create_app(settings, Endpoints(sample_db, bootstrap), service=service)
        apps.append(app)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
        return client, topic

    yield make
    for app in apps:
        app.state.publisher.close()
        await asyncio.to_thread(app.state.readiness.close)  # its connection blocks clones
    for engine in engines:
        await engine.dispose()


def event(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": f"lim-{n}",
        "type": "upsert",
        "doc_id": f"doc-{n}",
        "text": "Some text.",
        "occurred_at": "2026-01-01T00:00:00Z",
        **extra,
    }


def sized(n: int, size: int) -> dict[str, Any]:
    """event(n) with its text padded so that its wire form is exactly ``size`` bytes."""
    base = len(encode_event(event(n, text="")))
    return event(n, text="x" * (size - base))


def assert_problem(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text[:500]
    assert resp.headers["content-type"] == PROBLEM
    body: dict[str, Any] = resp.json()
    assert body["status"] == status
    assert "Traceback" not in resp.text
    return body


async def test_ingest_size_edges_and_all_or_nothing(
    make_client: AppFactory, infra: Infra, sample_db: str
) -> None:
    """Failed on 47c574d (limit 2 MB, producer 1 MiB): an event of limit + 1 bytes was accepted,
    and in [small, 1.5 MB, small] the first was published before a 500."""
    client, topic = await make_client()
    at, over = sized(1, LIMIT), sized(2, LIMIT + 1)
    assert len(encode_event(at)) == LIMIT
    ok = await client.post("/v1/documents", json=at)
    assert ok.status_code == 202, ok.text[:300]
    refused = assert_problem(await client.post("/v1/documents", json=over), 422)
    assert refused["errors"][0]["errors"][0].startswith(f"oversize: {LIMIT + 1} bytes")
    batch = [event(3), sized(4, 1_500_000), event(5)]
    mixed = assert_problem(await client.post("/v1/documents", json=batch), 422)
    assert mixed["detail"] == "1 invalid event(s); nothing was published"
    messages = consume(infra.bootstrap, topic, expected=1)
    assert [json.loads(m.value)["event_id"] for m in messages] == ["lim-1"]
    assert len(messages[0].value) == LIMIT
    # What was accepted is kept for a broker loss (services/core/accepted_events.py), in the
    # form it was published; what was refused is not.
    kept = "SELECT event_id, value FROM accepted_events WHERE event_id LIKE 'lim-%'"
    rows = {r[0]: bytes(r[1]) for r in rows_of(sample_db, kept)}
    assert rows["lim-1"] == messages[0].value
    assert not {"lim-2", "lim-3", "lim-4", "lim-5"} & set(rows)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b'{"event_id": "e\\ud800", "type": "upsert", "doc_id": "d", "text": "t",'
         b' "occurred_at": "2026-01-01T00:00:00Z"}', 422),
        (b'[{"event_id": "e", "type": "upsert", "doc_id": "d", "text": "\\udfff",'
         b' "occurred_at": "2026-01-01T00:00:00Z"}]', 422),
        (b'{"event_id": "nul", "type": "upsert", "doc_id": "nul\\u0000doc", "text": "t",'
         b' "occurred_at": "2026-01-01T00:00:00Z"}', 422),
        (b'{"event_id": "v", "type": "upsert", "doc_id": "d", "text": "t", "version":'
         b' 1180591620717411303424, "occurred_at": "2026-01-01T00:00:00Z"}', 422),
        (b'{"event_id": "m", "type": "upsert", "doc_id": "d", "text": "t", "metadata": '
         + b'{"a":' * 40 + b"1" + b"}" * 40 + b', "occurred_at": "2026-01-01T00:00:00Z"}', 422),
        (b'{"event_id": ', 422),
        (b"[" * 5000 + b"]" * 5000, 400),
        (b"not json at all", 422),
    ],
)  # fmt: skip
async def test_hostile_ingest_bodies_are_4xx(
    make_client: AppFactory, raw: bytes, status: int
) -> None:
    """Failed on 47c574d: the lone surrogates answered 500; NUL, version 2^70 and deep metadata
    were accepted with 202 and dead-lettered later."""
    client, _ = await make_client()
    headers = {"content-type": "application/json"}
    resp = await client.post("/v1/documents", content=raw, headers=headers)
    assert_problem(resp, status)


async def test_query_and_entity_names_with_nul_are_422(make_client: AppFactory) -> None:
    """Failed on 47c574d: 500 (DataError from PostgreSQL)."""
    client, _ = await make_client()
    body = assert_problem(await client.post("/v1/query", json={"question": "who\u0000?"}), 422)
    assert "NUL" in body["detail"]
    assert_problem(await client.get("/v1/entities", params={"name": "Le\x00land"}), 422)
    params = {"from": "Leland\x00", "to": "Watertown"}
    assert_problem(await client.get("/v1/paths", params=params), 422)
    surrogate = b'{"question": "who \\ud800?"}'
    headers = {"content-type": "application/json"}
    assert_problem(await client.post("/v1/query", content=surrogate, headers=headers), 422)


async def test_delete_takes_slashes_and_refuses_control_characters(
    make_client: AppFactory, infra: Infra
) -> None:
    """Failed on 47c574d: a doc_id with '/' could not be deleted (404), and %00 answered 202."""
    client, topic = await make_client()
    ok = await client.delete("/v1/documents/folder/sub%2Fname.txt")
    assert ok.status_code == 202, ok.text
    for bad in ("nul%00doc", "tab%09doc", "%7F"):
        body = assert_problem(await client.delete(f"/v1/documents/{bad}"), 422)
        assert "control characters" in body["detail"]
    (message,) = consume(infra.bootstrap, topic, expected=1)
    assert message.key == b"folder/sub/name.txt"
    assert json.loads(message.value)["doc_id"] == "folder/sub/name.txt"


async def test_broker_down_is_a_quick_503(make_client: AppFactory) -> None:
    """Failed on 47c574d: 500 after 30 s."""
    dead = f"127.0.0.1:{free_port()}"
    client, _ = await make_client(bootstrap=dead, ingest_publish_timeout_s=1.0)
    t0 = time.monotonic()
    resp = await client.post("/v1/documents", json=event(1))
    assert time.monotonic() - t0 < 5
    assert_problem(resp, 503)
    assert resp.headers["retry-after"] == "1"
    again = await client.delete("/v1/documents/doc-1")
    assert_problem(again, 503)


async def test_body_size_is_refused_before_it_is_read(make_client: AppFactory) -> None:
    """Failed on 47c574d: no limit (a 100 MB body was parsed before the 422)."""
    client, _ = await make_client(api_max_body_bytes=10_000)
    declared = await client.post("/v1/documents", content=b"[" + b" " * 20_000 + b"]",
                                 headers={"content-type": "application/json"})  # fmt: skip
    assert "KGSTREAM_API_MAX_BODY_BYTES" in assert_problem(declared, 413)["detail"]
    chunks_read = 0

    async def stream() -> AsyncIterator[bytes]:
        nonlocal chunks_read
        yield b"["
        for _ in range(10_000):  # 100 MB if it were all read
            chunks_read += 1
            yield b" " * 10_000
        yield b"]"

    streamed = await client.post(
        "/v1/documents", content=stream(), headers={"content-type": "application/json"}
    )
    assert_problem(streamed, 413)
    assert chunks_read < 5
    small = await client.post("/v1/query", json={"question": "Leland", "mode": "vector"})
    assert small.status_code == 200


async def test_query_bounds_follow_the_settings(make_client: AppFactory) -> None:
    client, _ = await make_client(query_max_question_chars=20, query_max_k=3)
    long = assert_problem(await client.post("/v1/query", json={"question": "x" * 21}), 422)
    assert long["errors"] == [{"field": "question", "message": "21 characters; the limit is 20"}]
    big_k = assert_problem(await client.post("/v1/query", json={"question": "a", "k": 4}), 422)
    assert big_k["errors"][0]["field"] == "k"
    over_model = await client.post("/v1/query", json={"question": "a", "k": 51})
    assert_problem(over_model, 422)
    hops = await client.get("/v1/paths", params={"from": "a", "to": "b", "max_hops": 7})
    assert_problem(hops, 422)
    ok = await client.post("/v1/query", json={"question": "Leland", "mode": "vector"})
    assert ok.status_code == 200
    assert len(ok.json()["contexts"]) == 3  # the default k (5) is held to the bound


async def test_concurrent_queries_beyond_the_bound_are_429(make_client: AppFactory) -> None:
    """Failed on 47c574d: no admission control (every query was queued)."""
    client, _ = await make_client(query_max_concurrent=1)
    body = {"question": "Who directed the film shot in Leland?", "mode": "local"}
    answers = await asyncio.gather(*(client.post("/v1/query", json=body) for _ in range(6)))
    statuses = sorted(r.status_code for r in answers)
    assert set(statuses) == {200, 429}, statuses
    refused = next(r for r in answers if r.status_code == 429)
    assert_problem(refused, 429)
    assert refused.headers["retry-after"] == "1"
    later = await client.post("/v1/query", json=body)
    assert later.status_code == 200


async def test_query_time_budget_is_504(make_client: AppFactory) -> None:
    client, _ = await make_client(query_timeout_s=0.001)
    resp = await client.post("/v1/query", json={"question": "Leland", "mode": "local"})
    assert "KGSTREAM_QUERY_TIMEOUT_S" in assert_problem(resp, 504)["detail"]
    assert (await client.get("/healthz")).status_code == 200  # other routes are not timed


ServeApi = Callable[..., AbstractContextManager[str]]


@pytest.fixture
def serve_api(
    sample_db: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> ServeApi:
    """serve_api(wrap=None, **settings): the app on the sample database under a real uvicorn
    server (lifespan off: start-up checks and background tasks are not needed here), wrapped
    in ``wrap`` if given; a context manager that yields its base URL."""

    @contextmanager
    def start(wrap: Callable[[ASGIApp], ASGIApp] | None = None, **overrides: Any) -> Iterator[str]:
        settings = Settings(
            database_url=sample_db, kafka_bootstrap_servers=infra.bootstrap, **overrides
        )
        engine = make_engine(sample_db)  # its own: used only on the server's event loop
        service = build_query_service(settings, engine, embedder, extractor, cpu_pool)
        app = create_app(settings, Endpoints(sample_db, infra.bootstrap), service)
        with serve(wrap(app) if wrap else app, "off") as url:
            yield url

    return start


@pytest.fixture
def served(serve_api: ServeApi) -> Iterator[str]:
    """The app under a real uvicorn server, default settings."""
    with serve_api() as url:
        yield url


def test_text_plain_is_415_and_keeps_the_connection(served: str) -> None:
    """Failed on 47c574d: 500 and the keep-alive connection was reset."""
    with httpx.Client(base_url=served, timeout=10) as client:
        for path in ("/v1/documents", "/v1/query"):
            resp = client.post(path, content=b"hello", headers={"content-type": "text/plain"})
            assert_problem(resp, 415)
            assert resp.headers.get("connection") != "close"
        assert client.get("/healthz").status_code == 200
        big = client.post("/v1/documents", content=b" " * 5_000_000,
                          headers={"content-type": "application/json"})  # fmt: skip
        assert_problem(big, 413)


def test_publish_cli_size_edges(settings: Settings, infra: Infra, tmp_path: Path) -> None:
    """`kgstream publish`: a line of exactly the limit is sent, limit + 1 and a NUL doc_id are
    rejected by line number with a reason, never a traceback. Failed on 47c574d (limit + 1 was
    accepted; a 1.5 MB line died with MessageSizeTooLargeError)."""
    lines = [
        encode_event(sized(1, LIMIT)),
        encode_event(sized(2, LIMIT + 1)),
        encode_event(event(3, doc_id="nul\u0000doc")),
        encode_event(event(4)),
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = kgstream(settings, "publish", str(path), "--json")
    assert "Traceback" not in result.stderr
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["sent"] == 2
    rejected = {r["line"]: r["reason"] for r in report["rejected"]}
    assert set(rejected) == {2, 3}
    assert rejected[2].startswith(f"oversize: {LIMIT + 1} bytes")
    assert "control characters" in rejected[3]
    sent = consume(infra.bootstrap, settings.documents_topic, expected=2)
    assert sorted(json.loads(m.value)["event_id"] for m in sent) == ["lim-1", "lim-4"]


def test_publish_raised_limit_sends_and_topics_take_it(
    settings: Settings, infra: Infra, tmp_path: Path
) -> None:
    """With KGSTREAM_MAX_DOCUMENT_BYTES raised to 2 MB, a 1.5 MB event is sent (the producer is
    sized from the setting) to a topic created with the matching max.message.bytes."""
    raised = settings.model_copy(update={"max_document_bytes": 2_000_000})
    topic = f"big-{uuid.uuid4().hex[:8]}"
    ensure_topics(infra.bootstrap, {topic: 1}, max_message_bytes=topic_max_message_bytes(raised))
    path = tmp_path / "big.jsonl"
    path.write_bytes(encode_event(sized(7, 1_500_000)) + b"\n")
    env = {**env_for(settings), "KGSTREAM_DOCUMENTS_TOPIC": topic,
           "KGSTREAM_MAX_DOCUMENT_BYTES": str(raised.max_document_bytes)}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "publish", str(path), "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"sent": 1, "rejected": []}
    (message,) = consume(infra.bootstrap, topic, expected=1)
    assert len(message.value) == 1_500_000


def test_a_record_the_broker_refuses_is_a_rejected_line(
    infra: Infra, topics: dict[str, str]
) -> None:
    """publish_numbered never raises: a record the producer cannot send is reported by line."""
    producer = KafkaProducer(bootstrap_servers=infra.bootstrap, max_request_size=2_000)
    report = PublishReport()
    numbered = [(1, event(1)), (2, sized(2, 5_000)), (3, event(3))]
    publish_numbered(producer, topics["documents"], numbered, report)
    producer.close()
    assert report.sent == 2
    assert [r.line for r in report.rejected] == [2]
    assert report.rejected[0].reason.startswith("not sent: MessageSizeTooLargeError")


ALWAYS_OPEN = {"/healthz", "/readyz", "/metrics"}  # probes and scrapes: outside admission
HOLD_S = 60.0  # KGSTREAM_API_BODY_TIMEOUT_S for tests whose requests stall their bodies
HELD = "/test/held"  # a route of the tests' own: once admitted, it waits for their release


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Holders:
    """The HELD route on an app: each request to it holds its admission place until the
    release event is set, then answers 204."""

    def __init__(self) -> None:
        self.release, self.admitted = asyncio.Event(), 0

    async def held(self) -> Response:
        self.admitted += 1
        await self.release.wait()
        return Response(status_code=204)


async def holding(
    client: httpx.AsyncClient, n: int, headers: dict[str, str] | None = None
) -> tuple[asyncio.Event, list[Any]]:
    """n requests admitted and holding their places (set the event, then await the tasks)."""
    app = client._transport.app  # type: ignore[attr-defined]
    holders = Holders()
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != HELD]
    app.add_api_route(HELD, holders.held, methods=["POST"], include_in_schema=False)
    post = partial(client.post, HELD, json={}, headers=headers)
    tasks = [asyncio.create_task(post()) for _ in range(n)]
    deadline = time.monotonic() + 30
    while holders.admitted < n:
        assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
        assert time.monotonic() < deadline, f"{holders.admitted} of {n} admitted"
        await asyncio.sleep(0.02)
    return holders.release, tasks


def route_urls(app: Any) -> list[tuple[str, str, str]]:
    """(method, template, a concrete path) of every API route of the app."""
    return [
        (method, template, template.replace("{entity_id}", "1").replace("{doc_id}", "x"))
        for method, template in sorted(app_routes(app))
    ]


async def test_every_route_but_the_probes_is_under_admission(make_client: AppFactory) -> None:
    """Failed on 4163b39: only /v1/query and /v1/paths were limited; /v1/entities,
    /v1/communities, the document and status routes served any number at once."""
    client, _ = await make_client(query_max_concurrent=1)
    app = client._transport.app
    release, tasks = await holding(client, 1)
    try:
        for method, template, path in route_urls(app):
            if template == "/readyz":  # its own connection would outlive this app (no lifespan)
                continue
            resp = await client.request(method, path, json={} if method == "POST" else None)
            if template in ALWAYS_OPEN:
                assert resp.status_code != 429, (method, template)
            else:
                assert resp.status_code == 429, (method, template, resp.status_code)
                assert "KGSTREAM_QUERY_MAX_CONCURRENT" in resp.json()["detail"]
    finally:
        release.set()
        await asyncio.gather(*tasks)
    assert (await client.get("/v1/entities", params={"name": "Leland"})).status_code == 200


async def test_one_key_flooding_leaves_room_for_other_callers(
    make_client: AppFactory, sample_db: str
) -> None:
    """Failed on 4163b39: one key held every place (200 clients, all served, another caller's
    vector query waited 6 s); now a key holds at most its share and the next is 429."""
    engine = make_engine(sample_db)
    try:
        _, key = await create_key(engine, ["query", "ingest"], name="flooding")
    finally:
        await engine.dispose()
    client, _ = await make_client(query_max_concurrent=4, query_max_concurrent_per_key=2)
    release, tasks = await holding(client, 2, bearer(key))
    try:
        more = await client.get("/v1/communities", headers=bearer(key))
        assert "KGSTREAM_QUERY_MAX_CONCURRENT_PER_KEY" in assert_problem(more, 429)["detail"]
        other = await client.post("/v1/query", json={"question": "Leland", "mode": "vector"})
        assert other.status_code == 200  # another caller (no key on loopback) is served
    finally:
        release.set()
        held = await asyncio.gather(*tasks)
    assert [r.status_code for r in held] == [204, 204]
    assert (await client.get("/v1/entities", headers=bearer(key))).status_code != 429


async def test_metric_labels_are_bounded_whatever_the_request(make_client: AppFactory) -> None:
    """Failed on 4163b39: the method label was the raw method, so 300 random methods to
    /healthz made 300 series (no key needed)."""
    client, _ = await make_client()
    for n in range(40):
        await client.request(f"M{uuid.uuid4().hex[:8].upper()}", "/healthz")
        await client.request(f"X{n}", f"/no/such/{uuid.uuid4().hex}")
        await client.get(f"/v1/entities/{n}/{uuid.uuid4().hex}")
    text = (await client.get("/metrics")).text
    labels = [
        s.labels
        for family in text_string_to_metric_families(text)
        if family.name == "kgstream_http_requests"
        for s in family.samples
    ]
    app = client._transport.app
    pages = {r.path for r in app.routes if isinstance(r, Route | Mount)}  # /docs, /static, ...
    # (HELD: other tests' route, in this process's metrics if they ran first)
    templates = {template for _, template in app_routes(app)} | pages | {"unmatched", HELD}
    methods = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}
    assert {re.sub(r"\{(\w+):\w+\}", r"{\1}", ls["route"]) for ls in labels} <= templates
    assert {ls["method"] for ls in labels} <= methods
    assert {ls["method"] for ls in labels if ls["route"] == "/healthz"} >= {"other"}
    assert all(ls["status"].isdigit() or ls["status"] == "other" for ls in labels)
