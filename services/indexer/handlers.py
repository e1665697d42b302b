"""Document event handlers: plain async functions that receive their dependencies. No faust
here: the agent in app.py hands over batches of raw records and moves on.

This module is the indexer's one error boundary. Every record ends as applied, skipped
(duplicate, stale, unchanged) or dead-lettered with a reason, and no exception leaves
``handle_batch``: transient failures (database, broker, model endpoints) are retried with
backoff until they succeed, so the offset is never committed past an event that has not
landed; every other failure is dead-lettered (``processing_failed`` with the exception's class
and message). Cancellation (shutdown) is the one thing that passes through: the batch is then
not acked and is redelivered.

A batch shares its CPU work (its chunks embedded and extracted together, side by side:
services/indexer/compute.py) and ends in one write plan per upsert
(services/indexer/write_plan.py); every event still gets its own transaction,
in order (services/indexer/graph_store/). ``prepare_batch`` (the compute phase: reads only) and
``write_batch`` (the write phase) are separate so the agent can overlap the writes of one batch
with the compute of the next (services/indexer/pipeline.py). The agent's ``prepare_batch`` leaves
a large document, and what follows it on its partition, to a background lane
(services/indexer/lanes.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from services.core import cloudevents, log_context
from services.core.contracts import DocumentEvent, parse_document_event
from services.core.db.engine import without_statement_bound
from services.core.errors import PermanentError, StaleComputeError
from services.core.failures import (
    as_permanent,
    is_database_refusal,
    is_statement_timeout,
    is_transient,
)
from services.indexer import progress
from services.indexer.compute import compute, plan_upsert
from services.indexer.dead_letters import dead_letter
from services.indexer.deps import IndexerDeps, Outcome, RawRecord
from services.indexer.event_times import EventTimes
from services.indexer.graph_store import write_delete, write_upsert
from services.indexer.observer import observe_freshness, timed
from services.indexer.ordering import as_ordered, reference_time
from services.indexer.write_plan import UpsertPlan, WritePlan

__all__ = [
    "IndexerDeps",
    "Outcome",
    "PreparedBatch",
    "RawRecord",
    "apply_event",
    "handle_batch",
    "handle_record",
    "held",
    "prepare_batch",
    "write_batch",
]

log = logging.getLogger(__name__)
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


async def handle_record(deps: IndexerDeps, record: RawRecord) -> Outcome:
    """Apply one record, or dead-letter it with a reason."""
    return (await handle_batch(deps, [record]))[0]


async def handle_batch(deps: IndexerDeps, records: Sequence[RawRecord]) -> list[Outcome]:
    """Apply records in order; returns one outcome per record. Never raises (but for
    cancellation): see the module docstring."""
    return await write_batch(deps, await prepare_batch(deps, records))


@dataclass(frozen=True)
class PreparedBatch:
    """A batch after its compute phase (decode, plan, chunk, embed, extract, resolution
    inputs: one write plan per upsert), before any write. Planned against the state it was
    prepared on: the write phase checks again and recomputes an event whose document or merge
    candidates moved since."""

    records: Sequence[RawRecord]
    events: list[tuple[int, DocumentEvent]]
    rejected: list[tuple[int, PermanentError]]
    plans: dict[int, UpsertPlan]
    writes: dict[int, WritePlan]
    failed: dict[int, PermanentError]
    compute_started: float  # seconds since the epoch (services/indexer/event_times.py)
    compute_ended: float
    # (topic, partition) -> offset of its first large document: that record and the later ones
    # of its partition were left out of this batch, for the background lane (services/indexer/
    # lanes.py). Empty unless prepare_batch was asked to defer large documents.
    held_from: Mapping[tuple[str, int], int] = field(default_factory=dict)


async def prepare_batch(
    deps: IndexerDeps, records: Sequence[RawRecord], *, defer_large: bool = False
) -> PreparedBatch:
    """The compute phase: reads the database, writes nothing. Never raises (but for
    cancellation): what fails here is retried or dead-lettered by ``write_batch``.
    ``defer_large``: an upsert with more new chunks than ``deps.large_document_chunks``, and
    every later record of its partition, are left out (see ``PreparedBatch.held_from``)."""
    observer = deps.observer
    observer.batch(len(records))
    started = time.time()
    events: list[tuple[int, DocumentEvent]] = []
    rejected: list[tuple[int, PermanentError]] = []
    with timed(observer, "decode"):
        for i, record in enumerate(records):
            try:
                events.append((i, decode(deps, record)))
            except PermanentError as exc:
                rejected.append((i, exc))
    planned = await _plan_batch(deps, events)
    held_from = _large_documents(deps, records, planned[0]) if defer_large and planned else {}
    if held_from and planned:
        records, events, rejected, planned = _without_held(
            records, events, rejected, planned, held_from
        )
    plans, writes, failed = await _compute_plans(deps, planned)
    return PreparedBatch(
        records, events, rejected, plans, writes, failed, started, time.time(), held_from
    )


async def write_batch(deps: IndexerDeps, batch: PreparedBatch) -> list[Outcome]:
    """The write phase: dead letters, then one transaction per event in offset order, then the
    batch's progress. Returns one outcome per record; never raises (but for cancellation)."""
    observer, records = deps.observer, batch.records
    write_started = time.time()
    outcomes: list[Outcome] = ["dead_lettered"] * len(records)
    for i, reason in batch.rejected:
        await dead_letter(deps, records[i], reason, event=None)
    with timed(observer, "write"):
        for i, event in batch.events:
            with log_context.bound(event_id=event.event_id, doc_id=event.doc_id):
                if i in batch.failed:
                    await dead_letter(deps, records[i], batch.failed[i], event=event)
                    continue
                outcomes[i] = await _settle(deps, records[i], event, batch.writes.get(i))
                times = _times(batch, records[i], write_started)
                log.info("%s %s (%s)", event.type, outcomes[i], times.describe())
                if outcomes[i] in ("applied", "deleted"):
                    observe_freshness(
                        observer, event.occurred_at, records[i].timestamp, time.time()
                    )
    await progress.batch_done(deps, records)
    for outcome in outcomes:
        observer.outcome(outcome)
    return outcomes


def _times(batch: PreparedBatch, record: RawRecord, write_started: float) -> EventTimes:
    """The event's way from publish to now (its commit), part by part."""
    return EventTimes(
        published=record.timestamp,
        received=record.received_at,
        compute_started=batch.compute_started,
        compute_ended=batch.compute_ended,
        write_started=write_started,
        committed=time.time(),
    )


def decode(deps: IndexerDeps, record: RawRecord) -> DocumentEvent:
    """The record as a validated event; PermanentError with the reason for anything else. A
    CloudEvent (the Kafka binding's binary mode: ``ce_*`` headers; or structured mode:
    content-type application/cloudevents+json) is converted first; others are native."""
    if record.unreadable is not None:
        raise PermanentError("undecodable_batch", record.unreadable)
    try:
        if cloudevents.is_binary_mode(record.headers) or cloudevents.is_structured_mode(
            record.headers
        ):
            # A CloudEvent without ``time`` happened when its record was published.
            received = datetime.fromtimestamp(record.timestamp or time.time(), UTC)
            event = cloudevents.parse_record(
                record.value,
                record.headers,
                deps.max_document_bytes,
                deps.cloudevent_types,
                received,
            )
        else:
            event = parse_document_event(record.value or b"", deps.max_document_bytes)
    except PermanentError:
        raise
    except Exception as exc:  # the decoder's contract is PermanentError; hold it to that
        raise as_permanent(exc) from exc
    return _clock_bounded(deps, record, event)


def _clock_bounded(deps: IndexerDeps, record: RawRecord, event: DocumentEvent) -> DocumentEvent:
    """The event as it is ordered, stored and measured: an occurred_at too far ahead of its
    record's time is a broken clock, and would otherwise hold the document against every later
    update and delete (services/indexer/ordering.py)."""
    reference = reference_time(record.timestamp, time.time())
    ordered = as_ordered(event, reference, timedelta(seconds=deps.max_clock_skew_s))
    if ordered is not event:
        log.warning(
            "%s (doc %s): occurred_at %s is more than %gs ahead of its record's time:"
            " ordered at %s",
            event.event_id,
            event.doc_id,
            event.occurred_at.isoformat(),
            deps.max_clock_skew_s,
            ordered.occurred_at.isoformat(),
        )
    return ordered


async def apply_event(
    deps: IndexerDeps,
    event: DocumentEvent,
    plan: WritePlan | None = None,
    published_at: float | None = None,
) -> Outcome:
    """Apply a validated event (planning and computing it now unless its write plan is
    given); ``published_at`` is its record's timestamp (seconds since the epoch), recorded for
    freshness."""
    if event.type == "delete":
        return await write_delete(deps, event, published_at)
    if plan is None:
        async with deps.engine.connect() as conn:
            diff = await plan_upsert(deps, conn, event)
        (plan,) = await compute(deps, [diff])
    return await write_upsert(deps, plan, published_at)


Planned = tuple[dict[int, UpsertPlan], dict[int, PermanentError]]


async def _plan_batch(
    deps: IndexerDeps, events: Sequence[tuple[int, DocumentEvent]]
) -> Planned | None:
    """The batch's upserts planned (index -> plan, or the reason it cannot be); None when
    planning failed as a whole: each event then plans again on its own in ``_settle``."""
    plans: dict[int, UpsertPlan] = {}
    failed: dict[int, PermanentError] = {}
    try:
        with timed(deps.observer, "chunk"):
            async with deps.engine.connect() as conn:
                for i, event in events:
                    if event.type != "upsert":
                        continue
                    try:
                        plans[i] = await plan_upsert(deps, conn, event)
                    except PermanentError as exc:  # e.g. too many chunks: this event alone
                        failed[i] = exc
    except Exception as exc:  # noqa: BLE001 - each event plans again on its own in _settle
        log.info("planning a batch of %d failed, events go one by one: %s", len(events), exc)
        return None
    return plans, failed


async def _compute_plans(
    deps: IndexerDeps, planned: Planned | None
) -> tuple[dict[int, UpsertPlan], dict[int, WritePlan], dict[int, PermanentError]]:
    """Compute the batch's upserts together; on any failure, nothing is shared and each event
    is computed on its own (so one bad event cannot fail its neighbours)."""
    if planned is None:
        return {}, {}, {}
    plans, failed = planned
    try:
        results = await compute(deps, list(plans.values()))
    except Exception as exc:  # noqa: BLE001 - isolated below, event by event
        if len(plans) == 1 and not is_transient(exc):
            failed.update(dict.fromkeys(plans, as_permanent(exc)))  # it was this event
        elif len(plans) > 1:
            log.info("batch of %d falls back to single events: %s", len(plans), exc)
        return {}, {}, failed
    return plans, dict(zip(plans, results, strict=True)), failed


def _large_documents(
    deps: IndexerDeps, records: Sequence[RawRecord], plans: Mapping[int, UpsertPlan]
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> offset of its first upsert with more new chunks than one slice."""
    held: dict[tuple[str, int], int] = {}
    for i, plan in plans.items():
        if len(plan.fresh) > deps.large_document_chunks:
            r = records[i]
            held[(r.topic, r.partition)] = min(r.offset, held.get((r.topic, r.partition), r.offset))
    return held


def held(held_from: Mapping[tuple[str, int], int], topic: str, partition: int, offset: int) -> bool:
    """True when that record is at or after its partition's first large document."""
    start = held_from.get((topic, partition))
    return start is not None and offset >= start


def _without_held(
    records: Sequence[RawRecord],
    events: list[tuple[int, DocumentEvent]],
    rejected: list[tuple[int, PermanentError]],
    planned: Planned,
    held_from: Mapping[tuple[str, int], int],
) -> tuple[
    list[RawRecord], list[tuple[int, DocumentEvent]], list[tuple[int, PermanentError]], Planned
]:
    """The batch without its held records, renumbered."""
    kept = [i for i, r in enumerate(records) if not held(held_from, r.topic, r.partition, r.offset)]
    at = {old: new for new, old in enumerate(kept)}
    plans, failed = planned
    return (
        [records[i] for i in kept],
        [(at[i], e) for i, e in events if i in at],
        [(at[i], x) for i, x in rejected if i in at],
        (
            {at[i]: p for i, p in plans.items() if i in at},
            {at[i]: x for i, x in failed.items() if i in at},
        ),
    )


async def _settle(
    deps: IndexerDeps,
    record: RawRecord,
    event: DocumentEvent,
    plan: WritePlan | None,
) -> Outcome:
    """Apply one event: retried while it fails transiently, dead-lettered when it fails
    permanently or when the database, up and answering, refused it ``deps.max_refusals`` times
    (its partition must not wait on it forever: issue 30)."""
    delay = FIRST_BACKOFF_S
    recomputed = False
    refusals = 0
    while True:
        try:
            return await apply_event(deps, event, plan, record.timestamp)
        except Exception as exc:  # noqa: BLE001 - the boundary: retry or dead-letter, never raise
            if not is_transient(exc):
                await dead_letter(deps, record, as_permanent(exc), event=event)
                return "dead_lettered"
            if is_database_refusal(exc) and not is_statement_timeout(exc):
                refusals += 1
                if refusals >= deps.max_refusals:
                    await dead_letter(deps, record, _exhausted(exc, refusals), event=event)
                    return "dead_lettered"
            if isinstance(exc, StaleComputeError) and not recomputed:
                # Planned against state an earlier write has moved (the next batch is computed
                # while this one is written): recompute at once; back off if it happens again.
                log.info("recomputing %s: %s", event.event_id, exc)
                deps.observer.transient_retry()
                recomputed = True
                plan = None
                continue
            if is_statement_timeout(exc):
                # Slow, not stuck: under the same bound it would be cut again on every retry
                # and its partition would stall for good (docs/ingest.md, Failures).
                deps = replace(deps, engine=without_statement_bound(deps.engine))
            log.warning(
                "transient failure on %s, retry in %.1fs: %s: %s",
                event.event_id,
                delay,
                type(exc).__name__,
                exc,
            )
            deps.observer.transient_retry()
            await progress.retrying(deps, record, exc)
            plan = None  # recompute against the current state
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)


def _exhausted(exc: BaseException, refusals: int) -> PermanentError:
    """The dead letter of an event the database kept refusing."""
    cause = as_permanent(exc).detail
    return PermanentError(
        "retries_exhausted", f"the database refused it {refusals} times, last: {cause}"
    )
