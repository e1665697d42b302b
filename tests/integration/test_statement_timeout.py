"""A statement cut by statement_timeout is not retried forever (issue 18, review of finding 10):
the retry of that event runs with no statement bound, so work that is legitimate but slower
than the bound (a delete rebuilding hub descriptions, a lock wait) lands instead of being
recomputed and cut again while its partition stalls. The slow statement is injected where it
happens in production: a trigger in the event's own transaction."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from services.core.db.engine import DbTimeouts, make_engine
from services.indexer.handlers import IndexerDeps, handle_batch
from tests.support.faults import add_fault_trigger
from tests.support.graph import scalar
from tests.support.records import document_event, record, rows

pytestmark = pytest.mark.integration

BOUND_S = 1.0
SLOW_S = 2.5  # every chunk insert of doc 'slow' outlasts the bound, on every attempt


@pytest.fixture
async def bounded(deps: IndexerDeps, database_url: str) -> AsyncIterator[IndexerDeps]:
    """The handler's dependencies on an engine whose statements are bounded by BOUND_S, and
    a chunk insert of doc 'slow' that always takes SLOW_S."""
    add_fault_trigger(
        database_url,
        "slow",
        "BEFORE INSERT ON chunks",
        f"IF NEW.doc_id = 'slow' THEN PERFORM nextval('slow_seq'); PERFORM pg_sleep({SLOW_S});"
        " END IF; RETURN NEW;",
    )
    engine = make_engine(database_url, timeouts=DbTimeouts(statement_s=BOUND_S))
    yield replace(deps, engine=engine)
    await engine.dispose()


async def test_an_event_cut_by_the_statement_timeout_is_applied_on_its_retry(
    bounded: IndexerDeps, database_url: str
) -> None:
    slow = document_event(event_id="ev-slow", doc_id="slow", text="Ada Lovelace wrote notes.")
    after = document_event(event_id="ev-after", doc_id="after")
    # Before the fix every attempt was cut again: the batch never returned.
    outcomes = await asyncio.wait_for(handle_batch(bounded, [record(slow), record(after)]), 60)
    assert outcomes == ["applied", "applied"]
    assert scalar(database_url, "SELECT last_value FROM slow_seq") >= 2  # the first was cut
    docs = {r[0] for r in await rows(bounded, "SELECT doc_id FROM documents")}
    assert docs == {"slow", "after"}
    assert await rows(bounded, "SELECT reason FROM dead_letters") == []
    # The lifted bound was the retry's own: the pool's connections are bounded again.
    async with bounded.engine.connect() as conn:
        assert (await conn.exec_driver_sql("SHOW statement_timeout")).scalar() == "1s"
