"""Progress per partition in indexer_progress: after every batch, the offset after the last
record handled (applied, skipped or dead-lettered); while a transient failure is retried, since
when and why. Observational only: a failed write here is logged and never holds up indexing.

The stored offset keeps the greatest one recorded, except when this process's consumer went
back: its first batch on a partition, or a batch ending below the one before. Then the batch's
offset replaces it (a new epoch): after a broker restart on memory storage or a recreated topic
the offsets start again at 0, and keeping the old, higher ones would hide lag and stalls for
good (issue 18, finding 8); after a rebalance the new owner really is reading from the
committed offset again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sqlalchemy import text

from services.indexer.dead_letters import storable
from services.indexer.deps import IndexerDeps, RawRecord

log = logging.getLogger(__name__)
WRITE_TIMEOUT_S = 2.0

_DONE = text(
    "INSERT INTO indexer_progress (consumer_group, topic, partition, next_offset, handled_total)"
    " VALUES (:g, :t, :p, :o, :n) ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET"
    " next_offset = CASE WHEN CAST(:rebase AS boolean) THEN EXCLUDED.next_offset"
    "  ELSE GREATEST(indexer_progress.next_offset, EXCLUDED.next_offset) END,"
    " handled_total = indexer_progress.handled_total + EXCLUDED.handled_total,"
    " updated_at = now(), retrying_since = NULL"
)
_RETRY = text(
    "INSERT INTO indexer_progress (consumer_group, topic, partition, next_offset,"
    " retrying_since, last_error, last_error_at) VALUES (:g, :t, :p, :o, now(), :e, now())"
    " ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET"
    " retrying_since = coalesce(indexer_progress.retrying_since, now()),"
    " last_error = EXCLUDED.last_error, last_error_at = now()"
)


async def batch_done(deps: IndexerDeps, records: Sequence[RawRecord]) -> None:
    """Every record of the batch is handled: move each partition's offset."""
    if deps.consumer_group is None or not records:
        return
    per_partition: dict[tuple[str, int], tuple[int, int]] = {}
    for r in records:
        end, n = per_partition.get((r.topic, r.partition), (0, 0))
        per_partition[(r.topic, r.partition)] = (max(end, r.offset + 1), n + 1)
    positions = deps.positions
    params = [
        {"g": deps.consumer_group, "t": t, "p": p, "o": end, "n": n,
         "rebase": positions.went_back((t, p), end)}
        for (t, p), (end, n) in sorted(per_partition.items())
    ]  # fmt: skip
    if await _write("progress", deps, _DONE, params):
        positions.recorded.update({k: end for k, (end, _) in per_partition.items()})


async def retrying(deps: IndexerDeps, record: RawRecord, exc: BaseException) -> None:
    """A transient failure holds this record: say since when, and what failed last."""
    if deps.consumer_group is None:
        return
    error = storable(f"{type(exc).__name__}: {exc}", 1000)
    params = [
        {"g": deps.consumer_group, "t": record.topic, "p": record.partition,
         "o": record.offset, "e": error}
    ]  # fmt: skip
    await _write("retry state", deps, _RETRY, params)


async def _write(
    what: str, deps: IndexerDeps, statement: object, params: list[dict[str, object]]
) -> bool:
    async def go() -> None:
        async with deps.engine.begin() as conn:
            await conn.execute(statement, params)  # type: ignore[call-overload]

    try:
        await asyncio.wait_for(go(), WRITE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - observational: never hold up indexing
        log.info("could not record indexer %s: %s: %s", what, type(exc).__name__, exc)
        return False
    return True
