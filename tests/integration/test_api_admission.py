"""Admission control is counted per authenticated key and cannot be held without one (issue 18,
review of finding 12): the spellings auth accepts for one key share its allowance, requests with
no usable key are 401 before they take a place, a body that never arrives gives its place back
with 408, and keyless loopback callers may use every place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from tests.integration.test_api_limits import (
    HOLD_S,
    AppFactory,
    assert_problem,
    bearer,
    holding,
    make_client,
)

__all__ = ["make_client"]  # the fixture, used here by name
pytestmark = pytest.mark.integration
QUERY = {"question": "Leland", "mode": "vector"}


async def new_key(database_url: str, scopes: list[str]) -> str:
    engine = make_engine(database_url)
    try:
        return (await create_key(engine, scopes))[1]
    finally:
        await engine.dispose()


async def test_every_spelling_of_a_key_shares_its_allowance(
    make_client: AppFactory, sample_db: str
) -> None:
    """Failed before: the share was keyed on the raw header, so `bearer K` and `BEARER  K `
    (the same key to auth) were other keys and one key could take every place."""
    key = await new_key(sample_db, ["query", "ingest"])
    client, _ = await make_client(
        query_max_concurrent=8, query_max_concurrent_per_key=2, api_body_timeout_s=HOLD_S
    )
    release, tasks = await holding(client, 2, bearer(key))
    try:
        for spelling in (f"bearer {key}", f"BEARER  {key} ", f" Bearer {key}"):
            resp = await client.post("/v1/query", json=QUERY, headers={"Authorization": spelling})
            assert "KGSTREAM_QUERY_MAX_CONCURRENT_PER_KEY" in assert_problem(resp, 429)["detail"]
    finally:
        release.set()
        await asyncio.gather(*tasks)


async def test_no_usable_key_is_401_before_it_takes_a_place(
    make_client: AppFactory, sample_db: str
) -> None:
    """Failed before: admission ran before auth and the body was read before the key was
    checked, so stalled bodies with made-up keys held every place and an admin got 429."""
    admin = await new_key(sample_db, ["admin"])
    client, _ = await make_client(
        auth="required",
        query_max_concurrent=2,
        query_max_concurrent_per_key=1,
        api_body_timeout_s=HOLD_S,
    )
    made_up = [{}, {"Authorization": "Basic eDp5"}] + [bearer(f"kgs_made_{n}.up") for n in range(4)]
    release = asyncio.Event()
    try:
        tasks = [asyncio.create_task(stalled_query(client, release, h)) for h in made_up]
        done, _ = await asyncio.wait(tasks, timeout=10)
        assert len(done) == len(tasks), "requests without a valid key still hold places"
        for task in tasks:
            resp = assert_problem(task.result(), 401)
            assert resp["title"] == "Unauthorized"
        assert task.result().headers["WWW-Authenticate"].startswith("Bearer")
        status = await client.get("/v1/status", headers=bearer(admin))
        assert status.status_code == 200, status.text[:300]
    finally:
        release.set()


async def stalled_query(
    client: httpx.AsyncClient, release: asyncio.Event, headers: dict[str, str]
) -> httpx.Response:
    """POST /v1/query whose body does not end before ``release``."""

    async def body() -> AsyncIterator[bytes]:
        yield b'{"question": '
        await release.wait()
        yield b'"Leland"}'

    headers = {"content-type": "application/json", **headers}
    return await client.post("/v1/query", content=body(), headers=headers)


async def test_a_body_that_never_arrives_is_408_and_frees_its_place(
    make_client: AppFactory,
) -> None:
    """Failed before: a body that never arrived held its place for KGSTREAM_QUERY_TIMEOUT_S
    (30 s), then 504."""
    client, _ = await make_client(query_max_concurrent=1, api_body_timeout_s=0.5)
    never = asyncio.Event()
    resp = await asyncio.wait_for(stalled_query(client, never, {}), 10)
    assert "KGSTREAM_API_BODY_TIMEOUT_S" in assert_problem(resp, 408)["detail"]
    assert (await client.post("/v1/query", json=QUERY)).status_code == 200  # the place is free


async def test_keyless_loopback_callers_may_use_every_place(make_client: AppFactory) -> None:
    """Failed before: requests without a key shared one per-key allowance, so the default
    `kgstream up` (loopback, no keys) served at most 8 of its 16 places at once."""
    client, _ = await make_client(
        query_max_concurrent=4, query_max_concurrent_per_key=2, api_body_timeout_s=HOLD_S
    )
    release, tasks = await holding(client, 4)  # beyond the per-key share, all admitted
    try:
        full = await client.post("/v1/query", json=QUERY)
        assert "KGSTREAM_QUERY_MAX_CONCURRENT" in assert_problem(full, 429)["detail"]
    finally:
        release.set()
        await asyncio.gather(*tasks)
