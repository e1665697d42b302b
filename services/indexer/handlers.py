"""Document event handlers: plain async functions that receive their dependencies. No faust
here: the agent in app.py hands over batches of raw records and moves on.

A batch shares its CPU work (one embedding call, one extraction call); every event still gets
its own transaction, in order. Transient failures retry with backoff until they succeed, so the
offset is never committed past an event that has not landed; permanent ones are dead-lettered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sqlalchemy.exc import DBAPIError, OperationalError

from services.core.contracts import DocumentEvent, parse_document_event
from services.core.errors import PermanentError, TransientError
from services.indexer.apply import apply_delete, commit_upsert
from services.indexer.compute import Computed, UpsertPlan, compute, plan_upsert
from services.indexer.dead_letters import dead_letter
from services.indexer.deps import IndexerDeps, Outcome, RawRecord

__all__ = ["IndexerDeps", "Outcome", "RawRecord", "apply_event", "handle_batch", "handle_record"]

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 30.0


async def handle_record(deps: IndexerDeps, record: RawRecord) -> Outcome:
    """Apply one record, or dead-letter it with a reason."""
    return (await handle_batch(deps, [record]))[0]


async def handle_batch(deps: IndexerDeps, records: Sequence[RawRecord]) -> list[Outcome]:
    """Apply records in order; returns one outcome per record."""
    outcomes: list[Outcome] = ["dead_lettered"] * len(records)
    events: list[tuple[int, DocumentEvent]] = []
    for i, record in enumerate(records):
        try:
            events.append((i, parse_document_event(record.value or b"", deps.max_document_bytes)))
        except PermanentError as exc:
            await dead_letter(deps, record, exc, event=None)
    plans: dict[int, UpsertPlan] = {}
    computed: dict[int, Computed] = {}
    failed: dict[int, PermanentError] = {}
    try:
        async with deps.engine.connect() as conn:
            for i, event in events:
                if event.type == "upsert":
                    plans[i] = await plan_upsert(deps, conn, event)
        results = await compute(deps, list(plans.values()))
        computed = dict(zip(plans, results, strict=True))
    except Exception as exc:  # noqa: BLE001 - any failure: fall back to one event at a time
        if isinstance(exc, PermanentError) and len(plans) == 1:
            failed = dict.fromkeys(plans, exc)  # nothing to isolate: it was this event
        elif len(events) > 1:
            log.info("batch of %d falls back to single events: %s", len(events), exc)
        plans, computed = {}, {}
    for i, event in events:
        if i in failed:
            await dead_letter(deps, records[i], failed[i], event=event)
            continue
        outcomes[i] = await _apply_until_done(
            deps, records[i], event, plans.get(i), computed.get(i)
        )
    return outcomes


async def apply_event(
    deps: IndexerDeps,
    event: DocumentEvent,
    plan: UpsertPlan | None = None,
    computed: Computed | None = None,
) -> Outcome:
    """Apply a validated event (planning and computing it now unless given)."""
    if event.type == "delete":
        return await apply_delete(deps, event)
    if plan is None or computed is None:
        async with deps.engine.connect() as conn:
            plan = await plan_upsert(deps, conn, event)
        (computed,) = await compute(deps, [plan])
    return await commit_upsert(deps, plan, computed)


async def _apply_until_done(
    deps: IndexerDeps,
    record: RawRecord,
    event: DocumentEvent,
    plan: UpsertPlan | None,
    computed: Computed | None,
) -> Outcome:
    delay = 0.5
    while True:
        try:
            return await apply_event(deps, event, plan, computed)
        except PermanentError as exc:
            await dead_letter(deps, record, exc, event=event)
            return "dead_lettered"
        except (TransientError, OperationalError, DBAPIError) as exc:
            if isinstance(exc, DBAPIError) and not _transient_db(exc):
                failure = PermanentError("processing_failed", str(exc.orig))
                await dead_letter(deps, record, failure, event=event)
                return "dead_lettered"
            log.warning("transient failure on %s, retry in %.1fs: %s", event.event_id, delay, exc)
            plan = computed = None  # recompute against the current state
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)


def _transient_db(exc: DBAPIError) -> bool:
    if exc.connection_invalidated or isinstance(exc, OperationalError):
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None) or ""
    # 40001 serialization failure, 40P01 deadlock, 08xxx connection, 53xxx resources, 57P0x shutdown
    return sqlstate.startswith(("40", "08", "53", "57P"))
