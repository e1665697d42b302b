"""One recompute, end to end: snapshot row → consistent read → Leiden etc. (off the event
loop) → reports for changed communities → rows written to the side → atomic publish →
retention → announcement. The caller holds the recompute lock."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.communities import loader, snapshots
from services.communities.leiden import LeidenConfig
from services.communities.observer import NO_OBSERVER, PHASE_TIMINGS, CommunitiesObserver
from services.communities.report_plan import plan_reports
from services.communities.reports import ReportWriter
from services.communities.structure import compute_structure
from services.communities.summaries import Written, load_facts, write_reports
from services.communities.writer import write_rows
from services.core import log_context
from services.core.db.snapshots import graph_snapshot
from services.core.embedding import Embedder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecomputeDeps:
    """Built once by the composition root (services/communities/app.py)."""

    engine: AsyncEngine
    database_url: str
    leiden: LeidenConfig
    min_jaccard: float = 0.3
    keep: int = 3
    writer: ReportWriter | None = None  # None: no reports
    embedder: Embedder | None = None
    executor: Executor | None = None  # for the CPU-heavy part; None: a thread
    announce: snapshots.Announcer | None = None
    llm_model: str = ""
    observer: CommunitiesObserver = NO_OBSERVER  # metrics (services/communities/observer.py)


@dataclass(frozen=True)
class RecomputeResult:
    """What a recompute published and how long its stages took."""

    snapshot: snapshots.Published
    reason: str
    timings: dict[str, float] = field(default_factory=dict)


async def recompute(deps: RecomputeDeps, reason: str) -> RecomputeResult:
    """Build and publish a new snapshot; on failure the snapshot is marked failed and the
    error propagates (the published snapshot stays as it was)."""
    timings: dict[str, float] = {}
    clock = _Clock(timings)
    # The row exists before the data is read, so created_at never postdates what it holds
    # (`kgstream recompute --wait` relies on that).
    snapshot_id = await snapshots.begin(deps.engine, watermark=0, nodes=0, edges=0)
    with log_context.bound(snapshot_id=snapshot_id):
        return await _build_and_publish(deps, snapshot_id, reason, clock)


async def _build_and_publish(
    deps: RecomputeDeps, snapshot_id: int, reason: str, clock: _Clock
) -> RecomputeResult:
    timings = clock.timings
    try:
        published = await _build(deps, snapshot_id, clock)
    except BaseException as exc:
        if isinstance(exc, Exception):  # not a shutdown's cancellation
            deps.observer.recompute("failed")
        await asyncio.shield(snapshots.fail(deps.engine, snapshot_id))
        raise
    _observe(deps.observer, published, timings)
    clock.lap("publish_s")
    await snapshots.prune(deps.engine, deps.keep)
    clock.lap("prune_s")
    if deps.announce is not None:
        try:
            await deps.announce(published.event())
        except Exception:
            # The snapshot is published and readers already use it; the event is a hint.
            log.exception("snapshot %s published but its announcement failed", published.id)
    log.info(
        "snapshot %s published (%s): %s communities on %s levels, %s reports reused, "
        "%s generated, %s",
        published.id,
        reason,
        published.communities,
        published.levels,
        published.reports_reused,
        published.reports_generated,
        ", ".join(f"{k}={v:.2f}" for k, v in timings.items()),
    )
    return RecomputeResult(published, reason, timings)


def _observe(
    observer: CommunitiesObserver, published: snapshots.Published, timings: dict[str, float]
) -> None:
    observer.recompute("published")
    observer.reports(published.reports_reused, published.reports_generated)
    for key, phase in PHASE_TIMINGS.items():
        if key in timings:
            observer.phase(phase, timings[key])


async def _build(deps: RecomputeDeps, snapshot_id: int, clock: _Clock) -> snapshots.Published:
    async with graph_snapshot(deps.engine) as (conn, watermark):
        rows = await loader.load_graph_rows(conn)
        clock.lap("load.graph_s")
        previous = await loader.load_previous(conn)
        next_id = await loader.next_community_id(conn)
        clock.lap("load.previous_s")
        clock.timings["load_s"] = clock.timings["load.graph_s"] + clock.timings["load.previous_s"]
        structure = await asyncio.get_running_loop().run_in_executor(
            deps.executor,
            compute_structure,
            rows,
            previous.structure if previous else None,
            deps.leiden,
            deps.min_jaccard,
            next_id,
        )
        clock.timings.update({f"compute.{k}": v for k, v in structure.timings.items()})
        clock.lap("compute_s")
        plan, facts = None, None
        if deps.writer is not None:  # the facts come from the same database snapshot
            plan = plan_reports(
                structure,
                {fp: w for fp, (_, _, w) in previous.by_fingerprint.items()} if previous else {},
                deps.writer.name,
                deps.writer.max_entities,
                deps.writer.max_relations,
            )
            facts = await load_facts(conn, structure, plan, deps.writer.passages)
    written: dict[tuple[int, int], Written] = {}
    if deps.writer is not None and plan is not None and facts is not None:
        kept = {
            fp: (title, summary)
            for fp, (title, summary, w) in (previous.by_fingerprint if previous else {}).items()
            if w == deps.writer.name
        }
        written = await write_reports(
            deps.writer,
            deps.embedder,
            structure=structure,
            plan=plan,
            facts=facts,
            reused=kept,
            meter=deps.observer,
        )
        clock.lap("reports_s")
    reuse_from = (previous.snapshot_id, deps.writer.name) if previous and deps.writer else None
    await write_rows(deps.engine, snapshot_id, structure, written, reuse_from)
    clock.lap("write_s")
    await _record_usage(deps, written)
    return await snapshots.publish(
        deps.engine,
        snapshot_id,
        snapshots.Counts(
            watermark=watermark,
            nodes=len(rows.entity_ids),
            edges=len(rows.rel_ids),
            communities=structure.community_count,
            levels=len(structure.levels),
            reused=plan.reused if plan else 0,
            generated=len(written),
        ),
    )


async def _record_usage(deps: RecomputeDeps, written: dict[tuple[int, int], Written]) -> None:
    prompt = sum(w.report.usage[0] for w in written.values())
    completion = sum(w.report.usage[1] for w in written.values())
    if prompt or completion:
        async with deps.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO token_usage (purpose, model, prompt_tokens, completion_tokens)"
                    " VALUES ('community_reports', :m, :p, :c)"
                ),
                {"m": deps.llm_model, "p": prompt, "c": completion},
            )


class _Clock:
    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = now - self._last
        self._last = now
