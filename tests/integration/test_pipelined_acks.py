"""The agent's two-stage pipeline (issue 10): the compute of batch N+1 overlaps the write of
batch N, and acks still follow the writes. The write of batch A is held by a transient failure
while batch B is computed: nothing of B is acked (or written) before A is applied, a stop then
commits nothing, and the redelivered batches apply once, in order, A before B."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import pytest

from services.core.settings import Settings
from services.indexer.handlers import (
    IndexerDeps,
    PreparedBatch,
    RawRecord,
    prepare_batch,
    write_batch,
)
from services.indexer.observer import IndexerObserver
from services.indexer.pipeline import run_pipelined
from tests.support.faults import hold_chunk_inserts, release_chunk_inserts
from tests.support.records import document_event, record, rows

pytestmark = pytest.mark.integration

HELD = document_event(event_id="held-a", doc_id="held", title="Marie Curie")
NEXT = document_event(
    event_id="next-b",
    doc_id="next",
    title="Pierre Curie",
    text="Pierre Curie worked in Paris with Marie Curie at the Sorbonne.",
)


class Retries(IndexerObserver):
    """Counts transient retries; set once the first one happened."""

    def __init__(self) -> None:
        self.retried = asyncio.Event()

    def transient_retry(self) -> None:
        self.retried.set()


class Agent:
    """The agent's two stages over in-memory batches, recording what it prepared, wrote and
    acked (the ack is the last step of a write, as in services/indexer/app.py)."""

    def __init__(self, deps: IndexerDeps) -> None:
        self.deps = deps
        self.log: list[str] = []
        self.acked: list[int] = []
        self.prepared_b = asyncio.Event()

    async def prepare(self, batch: Sequence[RawRecord]) -> PreparedBatch:
        prepared = await prepare_batch(self.deps, batch)
        self.log.append(f"prepared {batch[0].offset}")
        if batch[0].offset == 1:
            self.prepared_b.set()
        return prepared

    async def write(self, batch: Sequence[RawRecord], prepared: PreparedBatch) -> None:
        self.log.append(f"write {batch[0].offset}")
        await write_batch(self.deps, prepared)
        self.acked.extend(r.offset for r in batch)
        self.log.append(f"acked {batch[0].offset}")


async def stream(
    batches: list[list[RawRecord]], *, stay_open: bool
) -> AsyncIterator[list[RawRecord]]:
    for batch in batches:
        yield batch
    if stay_open:
        await asyncio.Event().wait()  # a consumer with nothing more to deliver


async def test_a_held_batch_keeps_the_next_one_unacked_and_a_stop_commits_nothing(
    deps: IndexerDeps, settings: Settings
) -> None:
    observer = Retries()
    deps = replace(deps, observer=observer)
    batches = [[record(HELD, offset=0)], [record(NEXT, offset=1)]]
    hold_chunk_inserts(settings, "held")

    agent = Agent(deps)
    running = asyncio.create_task(
        run_pipelined(stream(batches, stay_open=True), agent.prepare, agent.write)
    )
    # B is computed while A's write is held by the transient failure (the overlap) ...
    await asyncio.wait_for(agent.prepared_b.wait(), 120)
    await asyncio.wait_for(observer.retried.wait(), 120)
    assert not running.done()
    # ... and nothing of B is written or acked before A is applied.
    assert agent.acked == []
    assert sorted(agent.log) == ["prepared 0", "prepared 1", "write 0"], agent.log

    running.cancel()  # a stop while A is held
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert agent.acked == []
    assert await rows(deps, "SELECT event_id FROM processed_events") == []
    assert await rows(deps, "SELECT doc_id FROM documents") == []

    # Redelivered after the stop: both apply once, written and acked in order.
    release_chunk_inserts(settings)
    again = Agent(deps)
    await asyncio.wait_for(
        run_pipelined(stream(batches, stay_open=False), again.prepare, again.write), 120
    )
    assert again.acked == [0, 1]
    assert again.log.index("acked 0") < again.log.index("write 1"), again.log
    applied = await rows(deps, "SELECT event_id, outcome FROM processed_events ORDER BY event_id")
    assert [(r.event_id, r.outcome) for r in applied] == [
        ("held-a", "applied"),
        ("next-b", "applied"),
    ]
