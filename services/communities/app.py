"""Communities worker process: the composition root. Builds the engine, report writer,
embedder, process pool and snapshot producer once, and runs the recompute check every
``communities_check_interval_s`` seconds with apscheduler until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from datetime import UTC, datetime

import openai
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.communities.leiden import LeidenConfig
from services.communities.llm_reports import LLMReportWriter
from services.communities.metrics import PrometheusCommunitiesObserver, show_snapshot
from services.communities.observer import NO_OBSERVER, CommunitiesObserver
from services.communities.policy import Policy
from services.communities.pool import make_pool
from services.communities.recompute import RecomputeDeps
from services.communities.reports import ExtractiveWriter, ReportWriter
from services.communities.snapshots import Announcer, kafka_announcer, published_state
from services.communities.worker import tick
from services.core.db.engine import DbTimeouts, check_schema, make_engine
from services.core.errors import ConfigurationError
from services.core.infra.manager import Endpoints
from services.core.llm.client import process_client
from services.core.models import build_context_adjudicator, build_embedder
from services.core.producer import make_producer
from services.core.settings import Settings
from services.core.telemetry.process import ProcessOps
from services.core.telemetry.server import OpsServer
from services.maintenance.consolidation import consolidate

log = logging.getLogger(__name__)


def build_deps(
    settings: Settings,
    database_url: str,
    *,
    executor: Executor | None = None,
    announce: Announcer | None = None,
    observer: CommunitiesObserver = NO_OBSERVER,
    client: openai.OpenAI | None = None,
) -> RecomputeDeps:
    """Everything a recompute needs, from the settings (``client``: the process's one OpenAI
    client; made here when not given, None offline)."""
    client = client or process_client(settings)
    writer = build_writer(settings, client)
    return RecomputeDeps(
        engine=make_engine(
            database_url,
            timeouts=DbTimeouts.from_settings(settings, settings.communities_statement_timeout_s),
        ),
        database_url=database_url,
        leiden=leiden_config(settings),
        min_jaccard=settings.communities_min_jaccard,
        keep=settings.snapshots_keep,
        writer=writer,
        embedder=build_embedder(settings, client) if writer is not None else None,
        executor=executor,
        announce=announce,
        llm_model=settings.llm_model,
        observer=observer,
    )


def leiden_config(settings: Settings) -> LeidenConfig:
    """The hierarchy settings."""
    return LeidenConfig(
        max_sizes=tuple(settings.communities_max_sizes),
        resolutions=tuple(settings.communities_resolutions),
        max_levels=settings.communities_max_levels,
        iterations=settings.communities_leiden_iterations,
        split_iterations=settings.communities_split_iterations,
        seed=settings.communities_seed,
        resplit_margin=settings.communities_resplit_margin,
    )


def policy(settings: Settings) -> Policy:
    """When to recompute, from the settings."""
    return Policy(
        threshold=settings.recompute_threshold,
        min_interval_s=settings.communities_min_interval_s,
        max_staleness_s=settings.communities_max_staleness_s,
    )


def build_writer(settings: Settings, client: openai.OpenAI | None) -> ReportWriter | None:
    """auto: the LLM when an endpoint is configured, else extractive; none: no reports."""
    mode = settings.community_reports
    if mode == "auto":
        mode = "llm" if settings.openai_base_url else "extractive"
    if mode == "none":
        return None
    if mode == "extractive":
        return ExtractiveWriter()
    if client is None:
        raise ConfigurationError("community_reports=llm needs KGSTREAM_OPENAI_BASE_URL")
    return LLMReportWriter(
        client,
        settings.llm_model,
        input_tokens=settings.community_report_input_tokens,
        output_tokens=settings.community_report_output_tokens,
        max_attempts=settings.llm_max_attempts,
        concurrency=settings.llm_concurrency,
    )


def _consolidation_job(
    settings: Settings, engine: AsyncEngine, client: openai.OpenAI | None
) -> Callable[[], Awaitable[None]] | None:
    """Consolidation on the schedule (services/maintenance/consolidation.py), or None: off
    (KGSTREAM_CONSOLIDATION_INTERVAL_S=0) or no LLM adjudicator to decide its band."""
    adjudicate = build_context_adjudicator(settings, client)
    if settings.consolidation_interval_s <= 0 or adjudicate is None:
        log.info(
            "consolidation is not scheduled: %s",
            "KGSTREAM_CONSOLIDATION_INTERVAL_S is 0"
            if settings.consolidation_interval_s <= 0
            else "no LLM adjudicator (offline, nothing decides its band; `kgstream maintain"
            " consolidate --out FILE` writes it out for a person)",
        )
        return None
    embedder = build_embedder(settings, client)

    async def job() -> None:
        try:
            report = await consolidate(engine, embedder, adjudicate=adjudicate)
            log.info(
                "consolidation: %d pair(s) looked at, %d merge curation(s) made",
                len(report.pairs),
                len(report.made),
            )
        except Exception:  # the next run tries again; nothing was half made (one rule each)
            log.exception("consolidation failed")

    return job


def run(settings: Settings, endpoints: Endpoints) -> None:
    """Run the worker in the foreground until SIGTERM or SIGINT."""
    asyncio.run(_serve(settings, endpoints))


async def _serve(settings: Settings, endpoints: Endpoints) -> None:
    # Leiden holds the GIL: a separate process keeps the event loop (and the scheduler) live.
    pool = make_pool()
    client = process_client(settings)  # the process's one OpenAI client (None offline)
    announcer = kafka_announcer(
        lambda: make_producer(endpoints.kafka_bootstrap_servers, settings, timeout_s=30),
        settings.snapshots_topic,
    )
    deps = build_deps(
        settings,
        endpoints.database_url,
        executor=pool,
        announce=announcer,
        observer=PrometheusCommunitiesObserver(),
        client=client,
    )
    rules = policy(settings)

    async def ready() -> str | None:
        async with deps.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return None

    async def refresh_snapshot() -> None:
        show_snapshot(await published_state(deps.engine))

    ops = ProcessOps(
        deps.engine,
        "communities",
        server=OpsServer(
            settings.communities_metrics_host,
            settings.communities_metrics_port,
            ready,
            ready_budget_s=settings.readiness_budget_s,
            ready_give_up_s=settings.db_connect_timeout_s,
        ),
        refresh=[refresh_snapshot],
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    scheduler = AsyncIOScheduler(timezone=UTC)

    async def job() -> None:
        try:
            result = await tick(deps, rules)
            if result.outcome == "published":
                await refresh_snapshot()
        except asyncio.CancelledError:
            if not stop.is_set():
                raise
            # Stopping mid-recompute is expected: the next run marks the half-built snapshot
            # failed and starts again; the published one is untouched.
            log.info("community recompute interrupted by shutdown")
        except Exception:
            # The failed snapshot row records it; the next tick retries after the interval.
            log.exception("community recompute failed")

    consolidation = _consolidation_job(settings, deps.engine, client)
    try:
        await check_schema(deps.engine, settings.embedding_dim)
        await ops.start()
        scheduler.add_job(
            job,
            "interval",
            seconds=settings.communities_check_interval_s,
            next_run_time=datetime.now(UTC),
            max_instances=1,
            coalesce=True,
            id="communities-recompute-check",
        )
        if consolidation is not None:
            scheduler.add_job(
                consolidation,
                "interval",
                seconds=settings.consolidation_interval_s,
                max_instances=1,
                coalesce=True,
                id="consolidation",
            )
        scheduler.start()
        log.info(
            "communities worker up: checking every %.0fs, threshold %.2f",
            settings.communities_check_interval_s,
            settings.recompute_threshold,
        )
        await stop.wait()
    finally:
        if scheduler.running:
            scheduler.shutdown(wait=False)
        await ops.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(announcer.close)
        await deps.engine.dispose()
