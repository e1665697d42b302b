"""Property-based fuzzing of the whole HTTP API, driven by its own OpenAPI document
(schemathesis), against the real app under uvicorn on the real database and broker.

Every operation gets up to EXAMPLES positive and EXAMPLES negative (schema-violating) cases;
operations with nothing to violate get no negative ones. With the 11 operations of today's API
that is about 640 cases (about 30 s on 2 shared cores; the count is printed with -s).
Every response must be 2xx/3xx or 4xx (4xx as application/problem+json), 503 only with
Retry-After, never 500, and no body may
carry a stack trace. ``FUZZ_HEADERS`` is where an Authorization header goes once keys land."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.result import Ok
from schemathesis.generation.modes import GenerationMode

from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.infra.topics import ensure_topics
from services.core.settings import Settings
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.conftest import Infra
from tests.support.graph import drop_database
from tests.support.query_fixtures import clone_database
from tests.support.server import serve

pytestmark = pytest.mark.integration
EXAMPLES = 50
FUZZ_HEADERS: dict[str, str] = {}  # e.g. {"Authorization": "Bearer <an admin key>"}
LEAKS = ("Traceback", 'File "', "sqlalchemy.", "psycopg.", "kafka.errors")


@pytest.fixture
def api_url(
    community_db: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> Iterator[str]:
    topic = f"fuzz-{uuid.uuid4().hex[:8]}"
    ensure_topics(infra.bootstrap, {topic: 2})
    # A copy: the fuzzed curation routes make rules, which must not reach the shared sample.
    url = clone_database(community_db, community_db.rsplit("/", 1)[1])
    settings = Settings(
        database_url=url,
        kafka_bootstrap_servers=infra.bootstrap,
        documents_topic=topic,
        read_wait_max_s=0.1,  # a min_snapshot / after_event not there is 409 after the wait
    )
    service = build_query_service(settings, make_engine(url), embedder, extractor, cpu_pool)
    try:
        with serve(create_app(settings, Endpoints(url, infra.bootstrap), service)) as base:
            yield base
    finally:
        drop_database(url)


def header(response: Any, name: str) -> str:
    """One header of a schemathesis response (its headers map names to lists)."""
    values = response.headers.get(name.lower()) or [""]
    return str(values[0])


def check_response(response: Any, what: str) -> None:
    status = response.status_code
    retry = header(response, "retry-after")
    assert status < 500 or (status == 503 and retry) or status == 504, (
        f"{what}: {status} {response.text[:300]}"
    )
    for leak in LEAKS:
        assert leak not in response.text, f"{what}: {leak!r} in {response.text[:300]}"
    if status >= 400:
        assert header(response, "content-type") == "application/problem+json", what
        body = response.json()
        assert body["status"] == status, what
        assert body["title"], what
        assert "detail" in body, what


def fuzz(
    operation: Any, mode: GenerationMode, api_url: str, session: requests.Session
) -> Counter[int]:
    """Run EXAMPLES cases of one operation in one generation mode; returns the status counts."""
    cases: Counter[int] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(base_url=api_url, session=session, headers=FUZZ_HEADERS, timeout=60)
        cases[response.status_code] += 1
        check_response(response, f"{case.method} {case.formatted_path} ({mode})")

    try:
        run()
    except Unsatisfiable:
        # Nothing to violate (no parameters, or a body that takes any JSON): no negative cases.
        assert mode is GenerationMode.NEGATIVE
    return cases


def test_every_operation_answers_4xx_problems_never_500(api_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    statuses: Counter[int] = Counter()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result  # our own OpenAPI document is valid
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                statuses += fuzz(result.ok(), mode, api_url, session)
    print(f"schemathesis cases run: {statuses.total()} by status {sorted(statuses.items())}")
    assert statuses.total() >= 300
    assert {200, 202, 404, 422} <= set(statuses)
