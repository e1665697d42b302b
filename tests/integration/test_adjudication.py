"""LLM adjudication of ambiguous entity merges happens before the write transaction (issue 8):
a slow endpoint delays its own event and holds no lock that another indexer waits on."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from services.core.db.engine import make_engine
from services.core.llm.adjudicator import make_adjudicator
from services.core.llm.client import process_client
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, handle_record
from services.indexer.resolution import ResolverConfig
from tests.support.openai_stub import OpenAIStub, document_blocks
from tests.support.records import document_event, record, rows

pytestmark = pytest.mark.integration

HOLD_S = 60.0  # a safety net only: the test releases the adjudicator itself
EINSTEIN = "Albert Einstein was a physicist. Albert Einstein lived in Bern."
# "Alberto Einstein": trigram 0.82 and name cosine 0.887 to "Albert Einstein", inside the
# ambiguous band (0.80 to 0.92), so the adjudicator is asked.
ALBERTO = "Alberto Einstein was a painter. Alberto Einstein lived in Milan."


def adjudicating(deps: IndexerDeps, stub: OpenAIStub) -> IndexerDeps:
    # The client waits longer than the stub may hold a request (HOLD_S).
    settings = Settings(openai_base_url=stub.base_url, llm_timeout_s=2 * HOLD_S, llm_max_attempts=1)
    client = process_client(settings)
    assert client is not None
    adjudicate = make_adjudicator(client, "stub-chat", attempts=1)
    return replace(deps, resolver=ResolverConfig.from_settings(settings, adjudicate))


async def test_a_slow_adjudicator_blocks_no_other_writer(
    deps: IndexerDeps, openai_stub: OpenAIStub, settings: Settings
) -> None:
    released: list[float] = []
    asked, release = threading.Event(), threading.Event()

    def slow_no(body: dict[str, Any]) -> str:
        asked.set()
        release.wait(HOLD_S)  # held until the other writer is done
        released.append(time.monotonic())
        return json.dumps({"same": False})

    openai_stub.chat_handler = slow_no
    base = document_event(event_id="a1", doc_id="doc-a", title="Physics", text=EINSTEIN)
    assert await handle_record(deps, record(base)) == "applied"

    slow = adjudicating(deps, openai_stub)
    first = document_event(event_id="b1", doc_id="doc-b", title="Art", text=ALBERTO, version=1)
    pending = asyncio.create_task(handle_record(slow, record(first)))
    try:
        assert await asyncio.to_thread(asked.wait, 60)

        # While the model is thinking: no transaction of ours is open, no row lock is held...
        activity = await rows(
            deps,
            "SELECT state FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND state LIKE '%transaction%'",
        )
        assert activity == []
        # ...so another indexer (its own engine) writes a newer version of the same document.
        assert settings.database_url is not None
        other = replace(deps, engine=make_engine(settings.database_url))
        newer = document_event(
            event_id="b2", doc_id="doc-b", title="Art", text=ALBERTO + " He painted.", version=2
        )
        try:
            assert await handle_record(other, record(newer)) == "applied"
            done_at = time.monotonic()
        finally:
            await other.engine.dispose()
        assert not released, "the other writer waited for the adjudicator"
    finally:
        release.set()

    # The held event then finds the newer version in its transaction and changes nothing.
    assert await pending == "stale"
    assert released
    assert done_at < released[0]
    version = await rows(deps, "SELECT version FROM documents WHERE doc_id = 'doc-b'")
    assert version == [(2,)]


async def test_adjudicator_decisions_reach_the_merge(
    deps: IndexerDeps, openai_stub: OpenAIStub
) -> None:
    openai_stub.chat_handler = lambda _body: json.dumps({"same": True})
    base = document_event(event_id="a1", doc_id="doc-a", title="Physics", text=EINSTEIN)
    assert await handle_record(deps, record(base)) == "applied"
    merged = document_event(event_id="b1", doc_id="doc-b", title="Art", text=ALBERTO)
    assert await handle_record(adjudicating(deps, openai_stub), record(merged)) == "applied"
    einsteins = await rows(deps, "SELECT name FROM entities WHERE name LIKE '%Einstein'")
    assert len(einsteins) == 1  # one entity, two names
    aliases = {r[0] for r in await rows(deps, "SELECT alias FROM aliases")}
    assert {"Albert Einstein", "Alberto Einstein"} <= aliases
    asked = openai_stub.requests_to("/chat/completions")
    assert len(asked) == 1
    names = document_blocks(asked[0].body["messages"][-1]["content"])
    assert names == [("A", "Alberto Einstein"), ("B", "Albert Einstein")]
