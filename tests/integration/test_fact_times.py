"""Time-scoped facts (issue 31, step 2) on the real database and the real offline models: the
times a sentence states are stored with its facts, read by entity and by time through
``GET /v1/facts`` (a day, days, a relationship type), follow their document through a new
version and a delete, equal a rebuild's, and are read under the caller's visibility."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.indexer.handlers import handle_record
from tests.conftest import Infra
from tests.integration.test_curations import ingest, rebuilt_with_rules
from tests.support.api_client import api_client
from tests.support.graph import (
    canonical_graph,
    create_database,
    drop_database,
    graph_diff,
    rows_of,
    to_record,
)
from tests.support.property_corpus import T0, Env

pytestmark = pytest.mark.integration

_ids = iter(range(1, 1_000_000))
HOUSE = "Acme Corporation"
SMITH = f"John Smith owned {HOUSE} from 1811 to 1827."
JONES = f"Mary Jones acquired {HOUSE} in 1827 and ran it until 1850."
PAN = f"Peter Pan owned {HOUSE} from June 1900 to 1950."


def event(doc_id: str, text: str, acl: list[str] | None = None) -> dict[str, Any]:
    n = next(_ids)
    out: dict[str, Any] = {
        "event_id": f"{doc_id}-{n}",
        "type": "upsert",
        "doc_id": doc_id,
        "title": f"Deeds {doc_id}",
        "text": text,
        "occurred_at": T0.replace(microsecond=n).isoformat(),
    }
    return out if acl is None else {**out, "acl": acl}


@pytest.fixture
def url(env: Env) -> Iterator[str]:
    made = create_database(env.server_url)
    yield made
    drop_database(made)


@dataclass
class Api:
    """The API on the test's database, with an operator's key and a plain one (no groups)."""

    client: httpx.AsyncClient
    admin: str
    plain: str

    async def facts(self, key: str, **params: Any) -> httpx.Response:
        return await self.client.get(
            "/v1/facts", params=params, headers={"Authorization": f"Bearer {key}"}
        )

    async def sentences(self, key: str, **params: Any) -> list[str]:
        found = await self.facts(key, **params)
        assert found.status_code == 200, found.text
        return [f["sentence"] for f in found.json()["facts"]]


@pytest.fixture
async def api(
    url: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[Api]:
    engine = make_engine(url)
    try:
        _, admin = await create_key(engine, ["query", "admin"], name="admin")
        _, plain = await create_key(engine, ["query"], name="plain")
        async with api_client(infra, url, engine, (embedder, extractor, cpu_pool)) as client:
            yield Api(client, admin, plain)
    finally:
        await engine.dispose()


DEEDS = event("doc-deeds", f"{SMITH} {JONES}")
LATER = event("doc-later", PAN, acl=["red"])


async def test_times_are_stored_with_their_sentences(env: Env, url: str) -> None:
    await ingest(env, url, [DEEDS, LATER])
    stored = rows_of(url, "SELECT sentence, valid_from, valid_to, expression FROM fact_times")
    spans = {(s, str(a), str(b), x) for s, a, b, x in stored}
    assert (SMITH, "1811-01-01", "1828-01-01", "from 1811 to 1827") in spans
    assert (JONES, "1827-01-01", "1851-01-01", "1827 and ran it until 1850") in spans
    assert (PAN, "1900-06-01", "1951-01-01", "from June 1900 to 1950") in spans


async def test_facts_by_entity_and_time_under_visibility(env: Env, url: str, api: Api) -> None:
    await ingest(env, url, [DEEDS, LATER])
    admin, plain = api.admin, api.plain
    # "The value of R for E at time t": who held the company on a day.
    at_1815 = await api.facts(admin, entity=HOUSE, at="1815-06-01")
    assert at_1815.status_code == 200, at_1815.text
    (fact,) = at_1815.json()["facts"]
    assert fact["sentence"] == SMITH
    assert (fact["valid_from"], fact["valid_to"]) == ("1811-01-01", "1828-01-01")
    assert fact["doc_id"] == "doc-deeds"
    ends = {(r["source"], r["target"]) for r in fact["relationships"]}
    assert any("John Smith" in pair for pair in ends), ends
    assert "John Smith" in {e["name"] for e in fact["entities"]}
    assert await api.sentences(admin, entity=HOUSE, at="1840-01-01") == [JONES]
    assert await api.sentences(admin, entity="John Smith", at="1840-01-01") == []
    # "Which facts held during [a, b]", by entity and over the whole graph.
    window = {"from": "1820-01-01", "to": "1830-12-31"}
    assert set(await api.sentences(admin, entity=HOUSE, **window)) == {SMITH, JONES}
    assert PAN in await api.sentences(admin, **{"from": "1950-01-01"})
    one_day = {"entity": HOUSE, "at": "1815-06-01"}
    assert await api.sentences(admin, type="co_occurs", **one_day) == [SMITH]
    assert await api.sentences(admin, type="NO_SUCH", **one_day) == []
    # Visibility: a red-only document's facts are not read by a caller without red.
    assert await api.sentences(admin, entity="Peter Pan", at="1950-06-01") == [PAN]
    assert (await api.facts(plain, entity="Peter Pan", at="1950-06-01")).status_code == 404
    assert PAN not in await api.sentences(plain, **{"from": "1800-01-01"})
    assert SMITH in await api.sentences(plain, **{"from": "1800-01-01"})
    # Filters narrow it like every read.
    nothing = '{"metadata": {"x": "y"}}'
    assert await api.sentences(admin, filters=nothing, **{"from": "1800-01-01"}) == []
    assert (await api.facts(admin, entity=HOUSE, filters=nothing)).status_code == 404
    # Bad requests say why.
    for bad in (
        {},
        {"entity": HOUSE, "at": "1900-01-01", "from": "1800-01-01"},
        {"entity": HOUSE, "from": "1900-01-01", "to": "1800-01-01"},
        {"entity": HOUSE, "at": "1900-13-01"},
    ):
        refused = await api.facts(admin, **bad)
        assert refused.status_code == 422, (bad, refused.text)


@pytest.mark.parametrize("mode", ["vector", "local", "path", "auto"])
async def test_a_fact_time_window_filters_every_read(
    env: Env, url: str, api: Api, mode: str
) -> None:
    """``filters.held``: only documents that state a fact which held in the window are read."""
    await ingest(env, url, [DEEDS, LATER])
    question = f"Who owned {HOUSE} before Peter Pan?"
    headers = {"Authorization": f"Bearer {api.admin}"}
    for window, only in (
        ({"gte": "1811-01-01", "lte": "1815-12-31"}, "doc-deeds"),
        ({"gte": "1940-01-01"}, "doc-later"),
    ):
        body = {"question": question, "mode": mode, "k": 5, "filters": {"held": window}}
        got = await api.client.post("/v1/query", json=body, headers=headers)
        assert got.status_code == 200, got.text
        answer = got.json()
        assert {c["doc_id"] for c in answer["contexts"]} <= {only}, answer["contexts"]
        assert answer["notes"][0].startswith("filters: states a fact held in"), answer["notes"]
    narrowed = await api.sentences(
        api.admin, filters='{"held": {"gte": "1940-01-01"}}', **{"from": "1800-01-01"}
    )
    assert narrowed == [PAN]


async def test_times_follow_their_document_and_equal_a_rebuild(
    env: Env, url: str, api: Api
) -> None:
    await ingest(env, url, [DEEDS, LATER])
    # A new version without Jones's sentence drops its time; a delete drops the rest.
    shorter = event("doc-deeds", SMITH)
    async with env.deps(url) as deps:
        assert await handle_record(deps, to_record(shorter)) == "applied"
    assert await api.sentences(api.admin, entity=HOUSE, at="1840-01-01") == []
    assert await api.sentences(api.admin, entity=HOUSE, at="1815-06-01") == [SMITH]
    got = canonical_graph(url)
    want = await rebuilt_with_rules(env, [], [shorter, LATER])
    assert got["fact_times"], "the rebuild compares no times"
    assert got == want, graph_diff(got, want)
    gone = {
        "event_id": "gone",
        "type": "delete",
        "doc_id": "doc-deeds",
        "occurred_at": T0.replace(microsecond=next(_ids)).isoformat(),
    }
    async with env.deps(url) as deps:
        assert await handle_record(deps, to_record(gone)) == "deleted"
    assert await api.sentences(api.admin, entity=HOUSE, at="1815-06-01") == []
    assert rows_of(url, "SELECT 1 FROM fact_times WHERE doc_id = 'doc-deeds'") == []


async def test_a_time_with_no_fact_in_its_sentence_stays_text(env: Env, url: str) -> None:
    await ingest(env, url, [event("doc-quiet", "It rained a lot in 1911. Nothing else.")])
    stored = rows_of(url, "SELECT sentence FROM fact_times")
    mentioned = rows_of(url, "SELECT DISTINCT sentence FROM mentions")
    assert {s for (s,) in stored} <= {s for (s,) in mentioned}
    assert ("It rained a lot in 1911.",) not in stored
