"""The typed client (services/client.py) against a real query API (uvicorn, keys required) and
a running indexer on the real database and broker: ingest, read your own write, look-ups,
curations and status, each answered as the API's models; a refusal as ApiError."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.client import ApiError, AsyncClient, Client
from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from services.core.infra.manager import Endpoints
from services.core.infra.ports import free_port
from services.core.settings import Settings
from services.query_api.app import create_app
from tests.conftest import Infra
from tests.support.server import serving
from tests.support.workers import start_worker, stop_workers, wait_ready

pytestmark = pytest.mark.integration
MEMO = {
    "doc_id": "memo-hopper",
    "title": "Grace Hopper",
    "text": "Grace Hopper led the team that wrote the FLOW-MATIC compiler at Remington Rand.",
}


@dataclass(frozen=True)
class Api:
    url: str
    app_key: str  # query and ingest
    ops_key: str  # admin


@pytest.fixture
async def api(settings: Settings, infra: Infra, tmp_path: Path) -> AsyncIterator[Api]:
    """A keyed API and an indexer on this test's database and topics."""
    assert settings.database_url is not None
    engine = make_engine(settings.database_url)
    try:
        app_key = (await create_key(engine, ["query", "ingest"], name="app"))[1]
        ops_key = (await create_key(engine, ["admin"], name="ops"))[1]
    finally:
        await engine.dispose()
    worker = start_worker(settings, tmp_path / "indexer.log")
    try:
        assert await asyncio.to_thread(wait_ready, [worker]), worker.output()
        # The after_event reads wait for publish, indexing and write: on a loaded machine that
        # can take well past the default 3 s, and the wait is not under test.
        waits = {"read_wait_max_s": 120.0, "query_timeout_s": 180.0}
        keyed = settings.model_copy(update={"auth": "required", **waits})
        endpoints = Endpoints(settings.database_url, infra.bootstrap)
        with serving(create_app(keyed, endpoints), free_port()) as base:
            yield Api(base, app_key, ops_key)
    finally:
        await asyncio.to_thread(stop_workers, [worker])


def _use(api: Api) -> None:
    with Client(api.url, api_key=api.app_key) as kg:
        accepted = kg.ingest([MEMO])
        assert accepted.accepted == 1
        answer = kg.query(
            "Which compiler did Grace Hopper's team write?",
            mode="vector",
            after_event=accepted.event_ids[0],
        )
        assert answer.contexts[0].doc_id == "memo-hopper"
        assert "FLOW-MATIC" in answer.contexts[0].text
        document = kg.document("memo-hopper")
        assert (document.title, document.text) == (MEMO["title"], MEMO["text"])
        found = kg.entities("Grace Hopper")["entities"]
        assert found
        assert kg.entity(found[0]["id"]).name == found[0]["name"]
        with pytest.raises(ApiError) as refused:
            kg.status()
        assert refused.value.status == 403
        with pytest.raises(ApiError) as invalid:
            kg.ingest([{"doc_id": "no-text"}])
        assert invalid.value.status == 422
        assert invalid.value.errors[0]["index"] == 0

    with Client(api.url, api_key=api.ops_key) as ops:
        assert ops.status()["documents"] == 1
        # The API holds the walked graph (graph_holder.py) and takes the memo in: then local
        # mode walks it from memory and finds the memo.
        deadline = time.monotonic() + 60
        while not (ops.status()["graph_memory"] or {}).get("watermark"):
            assert time.monotonic() < deadline, ops.status()["graph_memory"]
            time.sleep(0.2)
        held = ops.status()["graph_memory"]
        assert held["held"] is True
        assert held["error"] == ""
        local = ops.query("Which compiler did Grace Hopper's team write?", mode="local")
        assert local.mode_used == "local"
        assert local.contexts[0].doc_id == "memo-hopper"
        rule = ops.curate("alias", "Grace Hopper", "Amazing Grace", reason="her nickname")
        assert (rule.kind, rule.created_by.startswith("key:")) == ("alias", True)
        assert ops.curate("alias", "Grace Hopper", "Amazing Grace").id == rule.id  # in force
        assert [c.id for c in ops.curations().curations] == [rule.id]
        assert ops.undo(rule.id, reason="test").undone_at is not None


async def test_the_client_against_the_api(api: Api) -> None:
    await asyncio.to_thread(_use, api)
    async with AsyncClient(api.url, api_key=api.app_key) as kg:
        gone = await kg.delete("memo-hopper")
        assert gone.accepted == 1
        after = await kg.query("Grace Hopper", after_event=gone.event_ids[0], k=1)
        assert after.contexts == []  # the read waited for the delete
        with pytest.raises(ApiError) as missing:
            await kg.document("memo-hopper")
        assert missing.value.status == 404
